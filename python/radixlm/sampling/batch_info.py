"""SamplingBatchInfo: how to sample one batch, as device tensors built once per step from the
requests' SamplingRequests, plus host-side flags saying which sampling stages any row needs."""

from __future__ import annotations

import math
from dataclasses import dataclass
import torch

from radixlm.sampling.noise import row_key
from radixlm.sampling.penalties import LogitAdjustments
from radixlm.sampling.request import SamplingRequest
from radixlm.sampling.token_mask import TokenMask
from radixlm.utils.device import to_device


@dataclass
class SamplingBatchInfo:
    """Device tensors (and host-side flags) describing how to sample one batch."""

    vocab_size: int
    temperatures: torch.Tensor  # [B, 1] float32; 1.0 for greedy rows
    top_ks: torch.Tensor  # [B] int64 in [1, V]; V where top-k is off
    top_p_limits: torch.Tensor  # [B] float32; +inf where top-p is off (so rounding drops nothing)
    log_min_ps: torch.Tensor  # [B] float32 log(min_p); -inf where min-p is off
    greedy_mask: torch.Tensor  # [B] bool
    row_keys: torch.Tensor  # [B] int64 in [0, 2**32): hash of (seed, len(output_ids))
    adjustments: LogitAdjustments
    # Host-side flags: which stages any row needs. Deciding here keeps `Sampler` free of syncs.
    all_greedy: bool = False
    any_greedy: bool = False
    need_top_k: bool = False
    need_top_p: bool = False
    need_min_p: bool = False
    max_top_k: int = 0  # largest top_k among sampled rows that use top-k (0 if none)
    top_p_needs_full_sort: bool = False  # some row uses top-p without top-k
    # Grammar constraints: the tokens each row may draw, applied after the penalties (set by
    # the scheduler when a row has a grammar; token_mask.py, constrained/).
    vocab_mask: TokenMask | None = None

    @property
    def batch_size(self) -> int:
        return self.greedy_mask.shape[0]

    @classmethod
    def build(cls, reqs: list[SamplingRequest], vocab_size: int,
              device: torch.device) -> "SamplingBatchInfo":
        n = len(reqs)
        temps: list[float] = []
        top_ks: list[int] = []
        top_ps: list[float] = []
        log_min_ps: list[float] = []
        greedy: list[bool] = []
        keys: list[int] = []
        need_top_k = need_top_p = need_min_p = full_sort = False
        max_top_k = 0
        for r in reqs:
            p = r.params
            g = p.is_greedy
            greedy.append(g)
            keys.append(row_key(r.seed, len(r.output_ids) + r.num_pending))
            # Greedy rows get neutral filter values: they take argmax and must not widen the
            # batch-level decisions below (e.g. force a sort that no sampled row needs).
            k = vocab_size if (g or p.top_k < 0) else min(p.top_k, vocab_size)
            tp = math.inf if (g or p.top_p >= 1.0) else float(p.top_p)
            mp = 0.0 if g else float(p.min_p)
            temps.append(1.0 if g else float(p.temperature))
            top_ks.append(k)
            top_ps.append(tp)
            log_min_ps.append(math.log(mp) if mp > 0.0 else -math.inf)
            if k < vocab_size:
                need_top_k = True
                max_top_k = max(max_top_k, k)
            need_top_p |= tp < 1.0
            full_sort |= tp < 1.0 and k == vocab_size
            need_min_p |= mp > 0.0

        # Two host->device copies instead of one per field.
        floats = to_device([temps, top_ps, log_min_ps], torch.float32, device)
        ints = to_device([top_ks, keys, [int(x) for x in greedy]], torch.int64, device)
        return cls(
            vocab_size=vocab_size,
            temperatures=floats[0].unsqueeze(1),
            top_p_limits=floats[1],
            log_min_ps=floats[2],
            top_ks=ints[0],
            row_keys=ints[1],
            greedy_mask=ints[2].bool(),
            adjustments=LogitAdjustments.build(reqs, vocab_size, device),
            all_greedy=n > 0 and all(greedy),
            any_greedy=any(greedy),
            need_top_k=need_top_k,
            need_top_p=need_top_p,
            need_min_p=need_min_p,
            max_top_k=max_top_k,
            top_p_needs_full_sort=full_sort,
        )
