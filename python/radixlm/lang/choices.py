"""How `select` turns the log-probabilities of each choice's tokens into a decision.

Input: for each choice, the logprobs of its tokens given the prompt (and the earlier choice
tokens). Every method reports the same per-choice score (the mean token logprob, i.e. the
length-normalized log-likelihood) so that results are comparable; they differ in how they pick,
and add what they picked by to the select's meta_info (SGLang's keys).

unconditional_likelihood_normalized also needs each choice's token logprobs without the prompt
(`requires_unconditional_logprobs`): the backend computes them with a second request.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChoiceDecision:
    index: int
    scores: list[float]          # mean logprob of each choice's tokens
    # What the method decided by, for the select's meta_info (SGLang's key names)
    meta: dict[str, Any] = field(default_factory=dict)


def mean_logprob(logprobs: list[float]) -> float:
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


def _pick(scores: list[float], temperature: float) -> int:
    """The best score (the first of equals); with temperature > 0, a sample from the softmax
    of the scores instead (a rarely wanted but well-defined generalisation)."""
    if temperature > 0:
        top = max(scores)
        weights = [math.exp((s - top) / temperature) for s in scores]
        return random.choices(range(len(scores)), weights)[0]
    return max(range(len(scores)), key=lambda i: scores[i])


class ChoicesMethod:
    name: str = "base"
    # True: the backend must also pass `unconditional` (each choice's token logprobs without
    # the prompt before it, the first one None), which costs one more request.
    requires_unconditional_logprobs: bool = False

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0,
                 unconditional: list[list[float | None]] | None = None) -> ChoiceDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesMethod):
    """Highest mean token logprob (the default); see _pick for temperature > 0."""
    name = "token_length_normalized"

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0,
                 unconditional: list[list[float | None]] | None = None) -> ChoiceDecision:
        scores = [mean_logprob(lp) for lp in logprobs]
        return ChoiceDecision(_pick(scores, temperature), scores)


class GreedyTokenSelection(ChoicesMethod):
    """What greedy decoding would have picked: compare the choices token position by token
    position, keeping only those with the best logprob at each position. A choice that has run
    out of tokens competes with its mean logprob, so that "Paris" is not beaten by a longer
    option whose later tokens are near-certain once its first token is chosen."""
    name = "greedy_token_selection"

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0,
                 unconditional: list[list[float | None]] | None = None) -> ChoiceDecision:
        scores = [mean_logprob(lp) for lp in logprobs]
        meta = {"greedy_logprob_matrix": _padded_matrix(logprobs, scores)}
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
        return ChoiceDecision(min(alive, key=lambda i: (len(logprobs[i]), i)), scores, meta)


def _padded_matrix(logprobs: list[list[float]], scores: list[float]) -> list[list[float]]:
    """What greedy selection compares (SGLang's greedy_logprob_matrix): each choice's token
    logprobs, a shorter choice padded with its mean to the longest one's length."""
    longest = max((len(lp) for lp in logprobs), default=0)
    return [list(lp) + [score] * (longest - len(lp)) for lp, score in zip(logprobs, scores)]


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Highest mean of (logprob of a choice's token after the prompt - its logprob without the
    prompt): how much the prompt raises each choice above its prior likelihood, so a choice
    that is merely common text does not win. The first token has no logprob without context
    (None): it counts as 0 there, as in SGLang."""
    name = "unconditional_likelihood_normalized"
    requires_unconditional_logprobs = True

    def __call__(self, logprobs: list[list[float]], temperature: float = 0.0,
                 unconditional: list[list[float | None]] | None = None) -> ChoiceDecision:
        if unconditional is None:
            raise ValueError(f"{self.name} needs each choice's token logprobs without the "
                             f"prompt (the backend computes them)")
        if len(unconditional) != len(logprobs) or \
                any(len(u) != len(lp) for u, lp in zip(unconditional, logprobs)):
            raise ValueError("conditional and unconditional token logprobs must have the same "
                             "lengths")
        normalized = [mean_logprob([c - (u or 0.0) for c, u in zip(lp, un)])
                      for lp, un in zip(logprobs, unconditional)]
        meta = {"unconditional_token_logprobs": unconditional,
                "normalized_unconditional_prompt_logprobs": normalized}
        scores = [mean_logprob(lp) for lp in logprobs]
        return ChoiceDecision(_pick(normalized, temperature), scores, meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
_BY_NAME = {m.name: m for m in (token_length_normalized, greedy_token_selection,
                                unconditional_likelihood_normalized)}


def resolve(method: ChoicesMethod | str | None) -> ChoicesMethod:
    if method is None:
        return token_length_normalized
    if isinstance(method, ChoicesMethod):
        return method
    if isinstance(method, str) and method in _BY_NAME:
        return _BY_NAME[method]
    raise ValueError(f"unknown choices_method {method!r}; use one of {sorted(_BY_NAME)}")
