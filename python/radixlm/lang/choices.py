"""How `select` turns the log-probabilities of each choice's tokens into a decision.

Input: for each choice, the logprobs of its tokens given the prompt (and the earlier choice
tokens). Both methods report the same per-choice score (the mean token logprob, i.e. the
length-normalized log-likelihood) so that results are comparable; they differ in how they pick.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ChoiceDecision:
    index: int
    scores: list[float]          # mean logprob of each choice's tokens


def mean_logprob(logprobs: list[float]) -> float:
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


class ChoicesMethod:
    name: str = "base"

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0) -> ChoiceDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesMethod):
    """Highest mean token logprob (the default). With temperature > 0, sample from the softmax
    of the scores instead (a rarely wanted but well-defined generalisation)."""
    name = "token_length_normalized"

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0) -> ChoiceDecision:
        scores = [mean_logprob(lp) for lp in logprobs]
        if temperature > 0:
            top = max(scores)
            weights = [math.exp((s - top) / temperature) for s in scores]
            return ChoiceDecision(random.choices(range(len(scores)), weights)[0], scores)
        return ChoiceDecision(max(range(len(scores)), key=lambda i: scores[i]), scores)


class GreedyTokenSelection(ChoicesMethod):
    """What greedy decoding would have picked: compare the choices token position by token
    position, keeping only those with the best logprob at each position. A choice that has run
    out of tokens competes with its mean logprob, so that "Paris" is not beaten by a longer
    option whose later tokens are near-certain once its first token is chosen."""
    name = "greedy_token_selection"

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0) -> ChoiceDecision:
        scores = [mean_logprob(lp) for lp in logprobs]
        alive = [i for i in range(len(logprobs)) if logprobs[i]] or list(range(len(logprobs)))
        longest = max((len(logprobs[i]) for i in alive), default=0)
        for pos in range(longest):
            def at(i: int) -> float:
                lp = logprobs[i]
                return lp[pos] if pos < len(lp) else scores[i]
            best = max(at(i) for i in alive)
            alive = [i for i in alive if at(i) >= best - 1e-6]
            if len(alive) == 1:
                break
        # Still tied (identical token sequences so far): the shortest one is the complete match.
        return ChoiceDecision(min(alive, key=lambda i: (len(logprobs[i]), i)), scores)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
_BY_NAME = {m.name: m for m in (token_length_normalized, greedy_token_selection)}


def resolve(method: ChoicesMethod | str | None) -> ChoicesMethod:
    if method is None:
        return token_length_normalized
    if isinstance(method, ChoicesMethod):
        return method
    if isinstance(method, str) and method in _BY_NAME:
        return _BY_NAME[method]
    raise ValueError(f"unknown choices_method {method!r}; use one of {sorted(_BY_NAME)}")
