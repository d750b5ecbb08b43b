"""Keeping a decode batch inside the KV pool: check room for the next token of each request, and
retract requests (back to the waiting queue, KV released) when there is none."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.scheduler.request import Req

RETRACT_DECODE_STEPS = 20


@dataclass
class NewTokenRatio:
    """Fraction of a running request's remaining max_new_tokens that admission reserves."""
    init: float
    min: float
    decay: float
    value: float = 0.0

    @classmethod
    def create(cls, conservativeness: float) -> "NewTokenRatio":
        init = min(1.0, 0.7 * conservativeness)
        low = min(init, 0.1 * conservativeness)
        return cls(init=init, min=low, decay=(init - low) / 600, value=init)

    def step(self) -> None:
        self.value = max(self.min, self.value - self.decay)

    def after_retraction(self, running: list[Req]) -> None:
        """Raise the ratio to what the surviving requests are likely to need."""
        decoded = sum(len(r.output_ids) for r in running)
        promised = sum(r.max_new_tokens for r in running) or 1
        estimate = (decoded + RETRACT_DECODE_STEPS * len(running)) / promised
        self.value = min(1.0, max(self.value, estimate))


def decode_tokens_needed(reqs: list[Req], page_size: int) -> int:
    """Tokens of KV (in whole pages) that one decode step of these requests takes: one token
    each, or every forced token of a request that jumped forward."""
    if page_size == 1:
        return sum(r.num_decode_tokens for r in reqs)
    # A request's rows write positions kv_allocated_len...; a new page for each one they start.
    total = 0
    for r in reqs:
        start, end = r.kv_allocated_len, r.kv_allocated_len + r.num_decode_tokens
        total += (-(-end // page_size) - -(-start // page_size)) * page_size
    return total


def rows_for_next_decode(running: list[Req], context_len: int) -> list[Req]:
    """The running requests the next decode step computes a row for: not those whose tokens
    in flight (overlap scheduler: a launched step not processed yet) bring them to their
    max_new_tokens or to the context length. Those finish by length when that step is
    processed, so a row launched for them now would be computed and dropped: one wasted row
    per request, and at batch 1 a whole wasted forward at the end of every request."""
    return [r for r in running
            if not (r.num_pending
                    and (len(r.output_ids) + r.num_pending >= r.max_new_tokens
                         or r.seq_len + r.num_pending >= context_len))]


def pick_retraction_victim(reqs: list[Req]) -> Req:
    """The request that loses least work: fewest output tokens, then the longest prompt (it
    frees the most memory)."""
    return min(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len, -r.arrival))
