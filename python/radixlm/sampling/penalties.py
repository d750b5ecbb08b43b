"""Logit adjustments applied before temperature: logit_bias, penalties, min_new_tokens bans.

Everything is turned into device tensors once per step (one pass over the requests in
`LogitAdjustments.build`); applying them is a handful of whole-batch tensor ops with no Python loop
over rows. Each part is None when no row of the batch uses it, so a batch without penalties pays
nothing for them.

Semantics (those of vLLM / OpenAI):
- logit_bias: added to the raw logits.
- repetition_penalty r (multiplicative, over prompt AND output tokens, counted once per token):
  a logit l > 0 becomes l / r, otherwise l * r.
- frequency_penalty f and presence_penalty p (additive, over OUTPUT tokens only):
  l -= f * count(token) + p * (count(token) > 0).
- min_new_tokens: while fewer tokens have been generated, the EOS ids (unless ignore_eos) and the
  request's stop_token_ids get -inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import torch

from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.sampling.params import SamplingParams
    from radixlm.sampling.request import SamplingRequest


def _flat_token_index(rows: list[int], token_lists: list[Sequence[int]],
                      vocab_size: int) -> torch.Tensor:
    """CPU int64 indices row * vocab_size + token into a flattened [B, V] tensor.

    Ids outside [0, vocab_size) are dropped: request validation rejects them upstream, and one bad
    id must not take down the whole batch.
    """
    # numpy converts a list of Python ints ~4x faster than torch.as_tensor, and takes arrays or
    # CPU tensors without a copy.
    parts = [torch.from_numpy(np.asarray(t, dtype=np.int64).reshape(-1)) for t in token_lists]
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    tokens = torch.cat(parts)
    lengths = torch.tensor([p.numel() for p in parts], dtype=torch.int64)
    row_ids = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lengths)
    valid = (tokens >= 0) & (tokens < vocab_size)
    return (row_ids * vocab_size + tokens)[valid]


def min_tokens_ban_index(rows: Iterable[tuple["SamplingParams", int, Sequence[int]]],
                         vocab_size: int) -> list[int]:
    """Flat indices into [B * V] of the tokens min_new_tokens bans this step; per row (its
    params, the tokens before the one sampled, the model's EOS ids). Plain ints: a row bans
    one or two ids, so this beats any per-row tensor work."""
    index: list[int] = []
    for i, (p, before, eos) in enumerate(rows):
        if before < p.min_new_tokens:
            base = i * vocab_size
            index.extend(base + t for t in p.stop_token_ids if 0 <= t < vocab_size)
            if not p.ignore_eos:
                index.extend(base + t for t in eos if 0 <= t < vocab_size)
    return index


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return to_device(values, torch.float32, device).unsqueeze(1)


@dataclass
class LogitAdjustments:
    """Per-step device tensors for the pre-temperature logit adjustments of one batch."""

    vocab_size: int
    # logit_bias: flat indices into [B * V] and the values added there.
    bias_index: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None
    # Repetition penalty: [B, V] bool "token occurs in prompt or output" and [B, 1] factors
    # (1.0 for rows that do not use it, which leaves their logits bit-identical).
    repetition_mask: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    # Frequency/presence: [B, V] float32 counts over output tokens and [B, 1] coefficients.
    output_counts: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    # min_new_tokens: flat indices into [B * V] that get -inf this step.
    banned_index: torch.Tensor | None = None

    @property
    def is_noop(self) -> bool:
        return (self.bias_index is None and self.repetition_mask is None
                and self.output_counts is None and self.banned_index is None)

    @classmethod
    def build(cls, reqs: Sequence["SamplingRequest"], vocab_size: int,
              device: torch.device) -> "LogitAdjustments":
        out = cls(vocab_size=vocab_size)
        bias_rows: list[int] = []
        bias_tokens: list[list[int]] = []
        bias_values: list[float] = []
        rep_rows: list[int] = []
        rep_tokens: list[Sequence[int]] = []  # prompt and output as two entries of one row
        cnt_rows: list[int] = []
        cnt_tokens: list[Sequence[int]] = []
        for i, r in enumerate(reqs):
            p = r.params
            # Out-of-range ids are dropped here (and by _flat_token_index) so ids and values align.
            bias = [(t, float(v)) for t, v in p.logit_bias.items() if 0 <= t < vocab_size]
            if bias:
                bias_rows.append(i)
                bias_tokens.append([t for t, _ in bias])
                bias_values.extend(v for _, v in bias)
            if p.repetition_penalty != 1.0:
                rep_rows += [i, i]
                rep_tokens += [r.prompt_ids, r.output_ids]
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                cnt_rows.append(i)
                cnt_tokens.append(r.output_ids)
        banned = min_tokens_ban_index(
            ((r.params, len(r.output_ids) + r.num_pending, r.eos_token_ids) for r in reqs),
            vocab_size)

        num_rows = len(reqs)
        if bias_rows:
            out.bias_index = to_device(_flat_token_index(bias_rows, bias_tokens, vocab_size),
                                       torch.int64, device)
            out.bias_values = to_device(bias_values, torch.float32, device)
        if rep_rows:
            idx = to_device(_flat_token_index(rep_rows, rep_tokens, vocab_size), torch.int64,
                            device)
            mask = torch.zeros(num_rows * vocab_size, dtype=torch.bool, device=device)
            mask[idx] = True
            out.repetition_mask = mask.view(num_rows, vocab_size)
            out.repetition_penalties = _column(
                [float(r.params.repetition_penalty) for r in reqs], device)
        if cnt_rows:
            idx = to_device(_flat_token_index(cnt_rows, cnt_tokens, vocab_size), torch.int64,
                            device)
            counts = torch.zeros(num_rows * vocab_size, dtype=torch.float32, device=device)
            counts.index_put_((idx,), torch.ones_like(idx, dtype=torch.float32), accumulate=True)
            out.output_counts = counts.view(num_rows, vocab_size)
            out.frequency_penalties = _column(
                [float(r.params.frequency_penalty) for r in reqs], device)
            out.presence_penalties = _column(
                [float(r.params.presence_penalty) for r in reqs], device)
        if banned:
            out.banned_index = to_device(banned, torch.int64, device)
        return out

    @classmethod
    def bans_only(cls, banned: list[int], vocab_size: int,
                  device: torch.device) -> "LogitAdjustments":
        """Only min_new_tokens bans (flat indices from min_tokens_ban_index)."""
        return cls(vocab_size=vocab_size,
                   banned_index=to_device(banned, torch.int64, device) if banned else None)

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """Apply in place to contiguous float32 logits [B, V] (a copy the sampler owns)."""
        flat = logits.view(-1)
        if self.bias_index is not None:
            flat.index_add_(0, self.bias_index, self.bias_values)
        if self.repetition_mask is not None:
            rp = self.repetition_penalties
            penalized = torch.where(logits > 0, logits / rp, logits * rp)
            logits.copy_(torch.where(self.repetition_mask, penalized, logits))
        if self.output_counts is not None:
            counts = self.output_counts
            logits.sub_(counts * self.frequency_penalties
                        + (counts > 0).to(torch.float32) * self.presence_penalties)
        if self.banned_index is not None:
            flat.index_fill_(0, self.banned_index, float("-inf"))
        return logits
