"""ForwardBatch: the device-side inputs of one forward pass, frozen for the step.

The scheduler's ScheduleBatch (CPU, mutable) builds one of these per step; nothing mutates it
afterwards, so an overlapped next step can't change what the running step reads. It is plain
data: tensors and host lists, no pools and no backend. The attention backend was handed to the
layers when the model was built (`bind_attention_backend`) and keeps the pools it writes to;
what it derives from a batch (kv indices, split layout) is the typed metadata its
`init_forward_metadata` returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"   # prefill, or a prefill chunk, possibly on top of a cached prefix
    # One new token per row. A row is usually a request; a request that jumped forward has one
    # row per forced token (consecutive positions), each attending to its KV up to that row.
    DECODE = "decode"
    # Several new tokens per request on top of a running request's KV, scored like an extend:
    # a jump-forward string, or a speculative draft to verify. Backends treat it as EXTEND.
    VERIFY = "verify"

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    @property
    def is_extend(self) -> bool:
        """Attention over several new tokens per request (EXTEND and VERIFY)."""
        return self is not ForwardMode.DECODE


@dataclass(frozen=True)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int                  # requests (decode: rows, see ForwardMode.DECODE)
    input_ids: torch.Tensor          # [T] int64, T = sum of extend lengths (decode: B)
    positions: torch.Tensor          # [T] int64
    out_cache_loc: torch.Tensor      # [T] int64: KV slot each new token is written to
    req_pool_indices: torch.Tensor   # [B] int64
    seq_lens: torch.Tensor           # [B] int64: tokens with KV after this step
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]   # [B] tokens already in KV before this step
    extend_seq_lens_cpu: list[int]      # [B] new tokens this step (decode: all 1)
    # Prompt logprobs: for each request, the positions (relative to this step's new tokens) whose
    # next-token distribution must be returned in full; empty when no request asks.
    input_logprob_rows: list[list[int]] = field(default_factory=list)
    # Decode rows that verify a tree of drafts (speculative decoding): row b sees the keys at
    # KV positions p >= tree_start[b] only where bit p - tree_start[b] of tree_mask[b] is set
    # (its own node and its ancestors). [B] int64 each; None when no row of the step has a tree
    # (a row without one has tree_start = its seq_len).
    tree_start: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None

    @property
    def extend_start_loc_cpu(self) -> list[int]:
        out, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            out.append(acc)
            acc += n
        return out
