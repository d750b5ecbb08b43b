"""Logprob types shared by the logits layer, the scheduler and the messages between processes."""

from __future__ import annotations

# (logprob, token_id); logprob is None for the first prompt token, which has no context.
TokenLogprob = tuple[float | None, int]
# the top alternatives at one position: [(logprob, token_id), ...], best first
TopLogprobs = list[tuple[float, int]]
