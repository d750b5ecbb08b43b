"""Split-KV decode attention (flash-decoding) over the token-level KV pool.

One new query token per request attends to the request's whole context. A decode batch has few
queries, so parallelising over (request, head) alone leaves most of an H100 idle when the batch is
small and the context long. We therefore also split each request's context into chunks:

  stage 1  grid (B, num_kv_heads, max_kv_splits): program (b, g, s) takes every query head of
           KV group g (GQA: the GROUP heads that share one K/V head, padded to BLOCK_H >= 16 rows
           so the score product is a tensor-core tl.dot), walks split s of request b's context in
           BLOCK_N-token tiles (each K/V tile is loaded once for the whole group), and writes the
           split's normalised partial output and its log-sum-exp (base 2).
  stage 2  grid (B, num_heads): combines request b's partials for one head, weighting each split
           by exp2(lse_s - max lse).

When the batch is large enough that every request gets one split (max_kv_splits == 1: 33+
requests over 8 KV heads on an H200) stage 1 writes the output itself and stage 2 is not
launched: a launch a layer and a float32 round trip of every output saved (Qwen3-0.6B at
batch 64: 28 launches, ~55 us a step). Combining the splits inside stage 1 instead (the last
split of a request to finish, found by an atomic counter, reads the others' partials) was
measured 4% slower end to end at batch 1 on Llama-3.1-8B (H200): the combining program's
serial reads sat on every layer's critical path.

The number of splits is a per-request device tensor bounded by a host integer `max_kv_splits`
(the grid's third dimension). Short requests in a batch use fewer splits than long ones, and a
CUDA graph could later capture the grid at a fixed `max_kv_splits` while the per-request counts
change between replays.

Scores use exp2 with the softmax scale pre-multiplied by log2(e); accumulation is fp32 whatever
the input dtype. For fp32 inputs the dots run in IEEE fp32 (tensor-core TF32 would lose ~1e-3).

An fp8 pool (`--kv-cache-dtype fp8_e4m3`) holds K / k_scale and V / v_scale: the tiles are loaded
as fp8 (half the bytes of bf16, which is what a memory-bound decode pays for) and widened in
registers. With bf16 queries the dots then run in fp16, not bf16: Hopper widens two e4m3 values
to two fp16 ones in one instruction, while bf16 takes that and two more conversions per pair
(the PTX Triton emits), and at bs 64, 4k the conversions, not the bytes, bounded the bf16 dots
(47% of copy bandwidth against a bf16 pool's 86%). fp16 holds every e4m3 value exactly, and the
query, rounded from bf16, exactly too down to 6e-5 (below, to 6e-8 absolute); queries past
fp16's range (65504) are clamped to it (a NaN stays NaN). p is in [0, 1]: fp16 rounds it finer
than bf16. The per-tensor scales are not multiplied into every element: K's is folded into the
score scale (q . (k_scale k) = k_scale (q . k)) and V's multiplies the split's output once
(sum p (v_scale v) = v_scale sum p v). Both are 1.0 for other pools, which leaves their
arithmetic exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.layers.attention.kernels.common import block_dmodel, next_pow2
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# Upper bound on splits per request: bounds the partial-output buffer
# ([B, num_heads, max_kv_splits, head_dim] fp32) and stage 2's tile.
MAX_KV_SPLITS = 64
# A split shorter than this spends more on its partial write and the reduction than it saves
# (64: at batch 1 a 1k context gets 16 splits per KV head, enough programs to hide latency).
MIN_TOKENS_PER_SPLIT = 64
LOG2E = 1.4426950408889634


def choose_max_kv_splits(batch_size: int, num_kv_heads: int, max_seq_len: int,
                         num_sms: int, min_tokens_per_split: int = MIN_TOKENS_PER_SPLIT) -> int:
    """How many splits the longest request gets: enough stage-1 programs for ~2 waves over the
    GPU's SMs, but never splits shorter than min_tokens_per_split."""
    programs_wanted = 2 * num_sms
    by_occupancy = -(-programs_wanted // max(1, batch_size * num_kv_heads))
    by_length = -(-max_seq_len // min_tokens_per_split)
    return max(1, min(MAX_KV_SPLITS, by_occupancy, by_length))


def per_request_kv_splits(seq_lens: torch.Tensor, max_kv_splits: int,
                          min_tokens_per_split: int = MIN_TOKENS_PER_SPLIT) -> torch.Tensor:
    """Splits for each request (device tensor, no host sync): as many as its length warrants,
    capped by the batch's max_kv_splits."""
    splits = (seq_lens + (min_tokens_per_split - 1)) // min_tokens_per_split
    return splits.clamp_(1, max_kv_splits).to(torch.int32)


@triton.jit
def split_range(kv_indptr, num_kv_splits, b, split, BLOCK_N: tl.constexpr):
    """(first index of request b's keys, this split's [lo, hi) key positions). Splits are
    whole tiles long, so only a request's last tile is ever partial; a split past the end is
    empty (lo >= hi)."""
    kv_start = tl.load(kv_indptr + b)
    seq_len = tl.load(kv_indptr + b + 1) - kv_start
    n_split = tl.load(num_kv_splits + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, n_split), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)
    return kv_start, lo, hi


@triton.jit
def _decode_kernel(
    Q, K_buf, V_buf, Out,             # Q, Out [B, Hq, D]; K/V pools [slots, Hk, D]
    kv_indptr, kv_indices, num_kv_splits,
    Mid_O, Mid_LSE,                   # [B, Hq, S, D] fp32, [B, Hq, S] fp32 (unused: ONE_SPLIT)
    sm_scale_log2,                    # softmax scale * log2(e) * the pool's k_scale
    v_scale,                          # the pool's v_scale
    Tree_start, Tree_mask,            # [B] int64 each, read only with HAS_TREE
    stride_qb, stride_qh,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PREC: tl.constexpr, HAS_TREE: tl.constexpr, ONE_SPLIT: tl.constexpr,
    FP16_DOTS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)   # the pool's newest K/V and the index lists are this step's (utils/pdl.py)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_start, lo, hi = split_range(kv_indptr, num_kv_splits, b, split, BLOCK_N)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h

    if lo < hi:  # programs past the end of a short request have nothing to do
        if HAS_TREE:
            tree_start = tl.load(Tree_start + b)
            tree_bits = tl.load(Tree_mask + b)
        offs_n = tl.arange(0, BLOCK_N)

        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=h_mask[:, None] & d_mask[None, :], other=0.0)
        if FP16_DOTS:   # an fp8 pool under bf16 queries (module docstring)
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0,
                         propagate_nan=tl.PropagateNan.ALL).to(tl.float16)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

        for start in range(lo, hi, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < hi
            if HAS_TREE:
                # A draft-tree row sees, past tree_start, only the keys whose bit is set.
                rel = (pos - tree_start).to(tl.int64)
                seen = ((tree_bits >> tl.maximum(rel, 0)) & 1) == 1
                n_mask = n_mask & ((rel < 0) | seen)
            # int64: slot * row stride overflows int32 for pools past ~2^31 elements.
            slot = tl.load(kv_indices + kv_start + pos, mask=n_mask, other=0).to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K_buf + slot[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC) * sm_scale_log2
            # Without a tree every tile holds >= 1 valid key, so m_new below is finite and no
            # row becomes NaN; a tree can mask whole tiles (and, in tests that force many
            # splits, whole splits).
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_ref = m_new
            if HAS_TREE:     # no key seen yet: exponents against 0 (all terms are 0 anyway)
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_ref)
            p = tl.exp2(s - m_ref[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V_buf + slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype),
                                                input_precision=DOT_PREC)
            m_i = m_new

        lse = m_i + tl.log2(l_i)
        if HAS_TREE:     # a split that saw no key: weight 0 in the combination, output 0
            lse = tl.where(l_i == 0.0, float("-inf"), lse)
            l_i = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_i[:, None] * v_scale
        mask = h_mask[:, None] & d_mask[None, :]
        if ONE_SPLIT:
            tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                     o.to(Out.dtype.element_ty), mask=mask)
        else:
            tl.store(Mid_O + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos
                     + offs_d[None, :], o, mask=mask)
            tl.store(Mid_LSE + b * stride_mlb + heads * stride_mlh + split, lse, mask=h_mask)
    elif ONE_SPLIT:
        # An empty request (CUDA-graph padding) gets zeros, as stage 2 would write.
        tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 tl.zeros([BLOCK_H, BLOCK_D], dtype=Out.dtype.element_ty),
                 mask=h_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_reduce_kernel(
    Mid_O, Mid_LSE, kv_indptr, num_kv_splits, Out,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)

    seq_len = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    n_split = tl.load(num_kv_splits + b)
    # Recompute stage 1's split length: splits starting at or past seq_len wrote nothing.
    split_len = tl.cdiv(tl.cdiv(seq_len, n_split), BLOCK_N) * BLOCK_N
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s * split_len < seq_len
    d_mask = offs_d < HEAD_DIM

    lse = tl.load(Mid_LSE + b * stride_mlb + head * stride_mlh + offs_s, mask=s_mask,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # an empty request (CUDA-graph padding) -> zeros
    w = tl.exp2(lse - m)
    part = tl.load(Mid_O + b * stride_mob + head * stride_moh + offs_s[:, None] * stride_mos
                   + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(w[:, None] * part, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(Out + b * stride_ob + head * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=d_mask)


def decode_block_n(head_dim: int, dtype: torch.dtype) -> int:
    """Keys per tile for dots in `dtype`. 64 tokens x 128 dims x 2 bytes = 16 KiB per K or V
    tile: room for double buffering."""
    return 32 if block_dmodel(head_dim) * torch.empty((), dtype=dtype).element_size() > 256 else 64


@dataclass
class SplitKVBuffers:
    """Where the splits of one decode step's attention meet (stage 2's input), allocated by
    its first layer and reused by the rest (every layer of a step has the same shapes)."""
    mid_o: torch.Tensor       # [B, Hq, S, D] float32: each split's normalised output
    mid_lse: torch.Tensor     # [B, Hq, S] float32: its log-sum-exp (base 2)


def alloc_decode_buffers(batch_size: int, num_heads: int, head_dim: int, max_kv_splits: int,
                         device: torch.device) -> SplitKVBuffers:
    mid_o = torch.empty((batch_size, num_heads, max_kv_splits, head_dim), dtype=torch.float32,
                        device=device)
    mid_lse = torch.empty((batch_size, num_heads, max_kv_splits), dtype=torch.float32,
                          device=device)
    return SplitKVBuffers(mid_o, mid_lse)


def decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                     num_kv_splits: torch.Tensor, max_kv_splits: int, sm_scale: float,
                     buffers: SplitKVBuffers, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     k_scale: float = 1.0, v_scale: float = 1.0,
                     tree_start: torch.Tensor | None = None,
                     tree_mask: torch.Tensor | None = None) -> torch.Tensor:
    """q/out [B, Hq, D]; k_buf/v_buf [slots, Hk, D]; request b attends to the slots
    kv_indices[kv_indptr[b]:kv_indptr[b+1]], in num_kv_splits[b] <= max_kv_splits splits.
    buffers: from alloc_decode_buffers (at least this batch size and max_kv_splits).
    k_scale/v_scale: what the pool's values are multiplied by (an fp8 pool's scales).
    tree_start/tree_mask ([B] int64, both or neither): rows verifying a tree of drafts see the
    keys from position tree_start[b] on only where bit (position - tree_start[b]) of
    tree_mask[b] is set (core/forward_batch.ForwardBatch)."""
    bs, hq, d = q.shape
    hk = k_buf.shape[1]
    mid_o, mid_lse = buffers.mid_o, buffers.mid_lse
    assert hq % hk == 0, f"{hq} query heads are not a multiple of {hk} KV heads"
    assert q.stride(-1) == 1 and k_buf.stride(-1) == 1 and v_buf.stride(-1) == 1
    assert max_kv_splits <= mid_o.shape[2]
    if bs == 0:
        return out
    group = hq // hk
    block_d = block_dmodel(d)
    # Keyed by the query's dtype: the tiles are widened to it (or to fp16, the same size).
    block_n = block_n or decode_block_n(d, q.dtype)
    if num_warps is None or num_stages is None:
        # FP8 tiles are widened in registers: 2 warps and a third stage keep the conversion off
        # the critical path (4 warps measured 1.8x slower at bs 64, 4k, head dim 128: bench
        # decode_kernel --kv-cache-dtype fp8_e4m3, H200).
        fp8 = k_buf.element_size() == 1
        num_warps = num_warps or (2 if fp8 else 4)
        num_stages = num_stages or (3 if fp8 else 2)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    has_tree = tree_mask is not None

    one_split = max_kv_splits == 1
    pdl = pdl_kwargs(q.device, bs)
    _decode_kernel[(bs, hk, max_kv_splits)](
        q, k_buf, v_buf, out, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse,
        sm_scale * LOG2E * k_scale, v_scale,
        tree_start if has_tree else kv_indptr, tree_mask if has_tree else kv_indptr,
        q.stride(0), q.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=max(16, next_pow2(group)),
        BLOCK_N=block_n, DOT_PREC=dot_prec, HAS_TREE=has_tree, ONE_SPLIT=one_split,
        FP16_DOTS=k_buf.element_size() == 1 and q.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages, **pdl,
    )
    if not one_split:
        _decode_reduce_kernel[(bs, hq)](
            mid_o, mid_lse, kv_indptr, num_kv_splits, out,
            mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_lse.stride(0), mid_lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=next_pow2(max_kv_splits), BLOCK_N=block_n,
            num_warps=4 if block_d >= 128 else 2, **pdl,
        )
    return out
