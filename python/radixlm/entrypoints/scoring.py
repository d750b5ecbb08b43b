"""Decoder-only scoring, SGLang's /v1/score and Engine.score: for every item, how likely each of
a few label tokens is to come right after query + item (item + query with `item_first`).

Each item is one prompt that generates a single token greedily, asking for the logprobs of the
label ids at that first position (`token_ids_logprob`): the model's next-token distribution
after the prompt, from the logits before any sampling transform. The prompts share the query,
so the radix cache prefills it once. A score is the label's probability (exp of its logprob), or
with `apply_softmax` the softmax over the labels' logprobs alone (the probabilities renormalised
over the labels, which then sum to 1).

Text input joins query and item as text and tokenizes the joined string (what a model would see
had the user typed it); token input joins the id lists.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from typing import Any

from radixlm.managers.prompt_length import check_chars_fit

# (n and the rest set: --preferred-sampling-params fill only what a request leaves unset)
SCORE_SAMPLING = {"max_new_tokens": 1, "temperature": 0.0, "n": 1}
# Items tokenized per call of the (batched) tokenizer: a request too long somewhere stops
# within a chunk of its first over-long prompt.
_TOKENIZE_CHUNK = 64


class ScoringCancelled(Exception):
    """The items' tokenizing stopped: nobody waits for the scores any more."""


class ScoringInputError(ValueError):
    """Bad scoring input; `param` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ScoringRequest:
    query: str | list[int]
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = False
    item_first: bool = False

    def item_list(self) -> list[Any]:
        """The items as a list (one text item may come bare); ScoringInputError for an `items`
        that is neither (a number, an object: never iterated into keys or characters)."""
        items = self.items
        if isinstance(items, str):
            return [items]
        if hasattr(items, "tolist"):          # (a numpy array from a Python caller)
            items = items.tolist()
        if not isinstance(items, (list, tuple)):
            raise ScoringInputError("items must be a string, a list of strings or a list of "
                                    "token-id lists", "items")
        return list(items)

    def check(self, vocab_size: int) -> None:
        """The checks that need no tokenizer: shapes, types that agree, ids in range. Token
        ids become lists of Python ints (a Python caller may pass tuples or numpy arrays)."""
        labels = _as_ids(self.label_token_ids)
        if not labels:
            raise ScoringInputError("label_token_ids must be a non-empty list of token ids",
                                    "label_token_ids")
        bad = next((t for t in labels if t >= vocab_size), None)
        if bad is not None:
            raise ScoringInputError(f"label_token_ids: {bad} is not a token id of this model "
                                    f"(0 to {vocab_size - 1})", "label_token_ids")
        self.label_token_ids = labels
        for name in ("apply_softmax", "item_first"):
            if not isinstance(getattr(self, name), bool):
                raise ScoringInputError(f"{name} must be true or false", name)
        items = self.item_list()
        if not items:
            raise ScoringInputError("items must hold at least one item", "items")
        if isinstance(self.query, str):
            if not all(isinstance(x, str) for x in items):
                raise ScoringInputError("items must be strings when query is a string", "items")
            self.items = items
            return
        query = _as_ids(self.query)
        if query is None:
            raise ScoringInputError("query must be a string or a list of token ids", "query")
        id_items = [_as_ids(x) for x in items]
        if any(x is None for x in id_items):
            raise ScoringInputError("items must be lists of token ids when query is a list of "
                                    "token ids", "items")
        for ids, param in [(query, "query"), *((x, "items") for x in id_items)]:
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise ScoringInputError(f"token id {bad} is out of the model's vocabulary "
                                        f"(0 to {vocab_size - 1})", param)
        self.query, self.items = query, id_items

    @property
    def is_text(self) -> bool:
        return isinstance(self.query, str)

    def prompts(self, tokenizer: Any, max_len: int,
                stop: threading.Event | None = None) -> list[list[int]]:
        """Each item's prompt ids (check() first); `max_len` is the longest prompt the server
        takes (the context less the scored position, at most what the KV cache holds). An
        over-long prompt is refused whatever the server's --allow-auto-truncate: a truncated
        prompt would score a different text. Text is refused by its length in characters
        before any tokenizing where it cannot fit, the query on its own first, and the items
        are tokenized in chunks that stop at the first prompt too long, or once `stop` is set
        (the client left: ScoringCancelled)."""
        items = self.item_list()
        if not self.is_text:
            # (lengths checked before any list is joined: a long query times many items)
            if len(self.query) > max_len:
                raise ScoringInputError(f"the query is {len(self.query)} tokens; "
                                        f"{_too_long(max_len)}", "query")
            prompts = []
            for i, item in enumerate(items):
                self._check_length(i, len(self.query) + len(item), max_len)
                prompts.append(item + self.query if self.item_first else self.query + item)
            return prompts
        self._check_query_text(tokenizer, max_len)
        prompts = []
        for start in range(0, len(items), _TOKENIZE_CHUNK):
            if stop is not None and stop.is_set():
                raise ScoringCancelled()
            texts = []
            for i, item in enumerate(items[start:start + _TOKENIZE_CHUNK], start):
                text = f"{item}{self.query}" if self.item_first else f"{self.query}{item}"
                try:
                    check_chars_fit(len(text), tokenizer, max_len)
                except ValueError as e:
                    raise ScoringInputError(f"item {i} with the query: {e}", "items") from None
                texts.append(text)
            for i, ids in enumerate(tokenizer(texts).input_ids, start):
                self._check_length(i, len(ids), max_len)
                prompts.append(list(ids))
        return prompts

    def _check_query_text(self, tokenizer: Any, max_len: int) -> None:
        """A text query too long on its own is refused at once, naming `query`."""
        try:
            check_chars_fit(len(self.query), tokenizer, max_len)
        except ValueError as e:
            raise ScoringInputError(f"the query: {e}", "query") from None
        query_len = len(tokenizer(self.query).input_ids)
        if query_len > max_len:
            raise ScoringInputError(f"the query is {query_len} tokens; {_too_long(max_len)}",
                                    "query")

    @staticmethod
    def _check_length(i: int, length: int, max_len: int) -> None:
        """Item i's prompt (the query's own length checked before)."""
        if not length:
            raise ScoringInputError(f"item {i}: query and item together are empty", "items")
        if length > max_len:
            raise ScoringInputError(f"item {i} with the query is {length} tokens; "
                                    f"{_too_long(max_len)}", "items")

    def scores(self, results: list[dict]) -> list[list[float]]:
        """The engine's results (one per prompt) -> each item's label scores."""
        return [self._label_scores(r["meta_info"]["output_token_ids_logprobs"][0])
                for r in results]

    def _label_scores(self, entries: list[list]) -> list[float]:
        logprob = {tid: lp for lp, tid, *_ in entries}
        lps = [logprob[tid] for tid in self.label_token_ids]
        if not self.apply_softmax:
            return [math.exp(lp) for lp in lps]
        top = max(lps)
        if top == -math.inf:          # (every label impossible: no distribution over them)
            return [0.0] * len(lps)
        weights = [math.exp(lp - top) for lp in lps]
        total = sum(weights)
        return [w / total for w in weights]


def _too_long(max_len: int) -> str:
    return (f"this server scores prompts of at most {max_len} tokens (the model's context "
            f"less the scored position, within the KV cache)")


def _is_id(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 0


def _as_ids(x: Any) -> list[int] | None:
    """`x` as a list of Python ints when it is a list, tuple or numpy array of token ids (ints
    >= 0, not booleans), else None."""
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        x = x.tolist()
    if not isinstance(x, (list, tuple)) or not all(_is_id(t) for t in x):
        return None
    return [int(t) for t in x]


def scoring_response(scores: list[list[float]], prompts: list[list[int]],
                     model: str) -> dict[str, Any]:
    """SGLang's ScoringResponse."""
    prompt_tokens = sum(len(p) for p in prompts)
    return {"object": "scoring", "model": model, "scores": scores,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                      "total_tokens": prompt_tokens}}
