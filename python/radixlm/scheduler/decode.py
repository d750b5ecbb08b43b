"""Keeping a decode batch inside the KV pool: check room for one more token per request, and
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
    """Tokens of KV (in whole pages) that one decode step of these requests takes."""
    if page_size == 1:
        return len(reqs)
    # A decode step writes the token at position kv_allocated_len; a new page when it starts one.
    return sum(page_size for r in reqs if r.kv_allocated_len % page_size == 0)


def pick_retraction_victim(reqs: list[Req]) -> Req:
    """The request that loses least work: fewest output tokens, then the longest prompt (it
    frees the most memory)."""
    return min(reqs, key=lambda r: (len(r.output_ids), -r.prompt_len, -r.arrival))
