"""ForwardBatch: the device-side inputs of one forward pass, frozen for the step.

The scheduler's ScheduleBatch (CPU, mutable) builds one of these per step; nothing mutates it
afterwards, so an overlapped next step can't change what the running step reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixlm.layers.attention.base import AttentionBackend
    from radixlm.mem_cache.pools import KVPool, ReqToTokenPool


class ForwardMode(enum.Enum):
    EXTEND = "extend"   # prefill, or a prefill chunk, possibly on top of a cached prefix
    DECODE = "decode"   # one new token per request

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    @property
    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND


@dataclass(frozen=True)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor          # [T] int64, T = sum of extend lengths (decode: B)
    positions: torch.Tensor          # [T] int64
    out_cache_loc: torch.Tensor      # [T] int64: KV slot each new token is written to
    req_pool_indices: torch.Tensor   # [B] int64
    seq_lens: torch.Tensor           # [B] int64: tokens with KV after this step
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]   # [B] tokens already in KV before this step
    extend_seq_lens_cpu: list[int]      # [B] new tokens this step (decode: all 1)
    req_to_token_pool: "ReqToTokenPool"
    kv_pool: "KVPool"
    attn_backend: "AttentionBackend"
    # Prompt logprobs: for each request, the positions (relative to this step's new tokens) whose
    # next-token distribution must be returned in full; empty when no request asks.
    input_logprob_rows: list[list[int]] = field(default_factory=list)
    # Per-batch metadata an attention backend computes in init_forward_metadata.
    attn_metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def extend_start_loc_cpu(self) -> list[int]:
        out, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            out.append(acc)
            acc += n
        return out
