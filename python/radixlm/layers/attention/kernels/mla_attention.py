"""Multi-head latent attention (MLA) over the latent pool: decode (split-KV) and extend.

With weight absorption (models/deepseek_v2.py) every query head attends to one shared row per
token, the latent [c (LORA values) | k_rope (ROPE values)]; V is c itself. So:

    score[h, t] = q_lat[h] . c[t] + q_rope[h] . k_rope[t]
    out[h]      = sum_t softmax(score)[h, t] * c[t]                  (LORA wide)

The point of the decode kernel is to read each token's latent once for all the heads: a
program takes BLOCK_H heads of one request and one split of its context, loads each tile of
latents once and uses it for both the scores and the output. Stage 2 (the split reduction) is
decode_attention.py's. LORA and ROPE are loaded as two parts (512 + 64 for DeepSeek), so
neither is padded to the next power of two of their sum.

The extend kernel (prefill, chunked prefill, verify and prefix hits) reads every key from the
pool too: the step's new latents are stored before it runs, so request b's keys are simply
kv_indices[kv_indptr[b]:kv_indptr[b+1]] over its whole sequence, with the causal mask
key position <= prefix + query index.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.layers.attention.kernels.common import block_dmodel, next_pow2
from radixlm.layers.attention.kernels.decode_attention import (
    LOG2E,
    SplitKVBuffers,
    _decode_reduce_kernel,
    split_range,
)
from radixlm.layers.attention.kernels.extend_attention import _online_softmax_step
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# MLA splits a request's context finer than GQA decode (decode_attention.MIN_TOKENS_PER_SPLIT):
# one head block's program reads a 576-wide latent per token for 16-32 heads, so a short
# context at a small batch leaves few programs, each a long serial chain. 32 tokens (one tile)
# a split: DeepSeek-V2-Lite's shape (16 heads) at batch 1, 1k context 9.9 -> 8.4 us, 128 heads
# 16.9 -> 11.6 us with 8 warps (H200, `results/issue16/mla_splits/`); where the batch already
# fills the GPU the occupancy bound, not this, sets the splits.
MLA_MIN_TOKENS_PER_SPLIT = 32


@triton.jit
def _latent_tile_scores(q_lat, q_rope, KV, kv_indices, kv_start, pos, n_mask, stride_kvt,
                        offs_l, offs_r, l_mask, r_mask, LORA: tl.constexpr,
                        DOT_PREC: tl.constexpr):
    """Load the latents of key positions `pos` (c [N, LORA] and k_rope [N, ROPE]) and score
    them: q_lat . c + q_rope . k_rope, unscaled [M, N]. Returns (scores, c); c is V."""
    slot = tl.load(kv_indices + kv_start + pos, mask=n_mask, other=0).to(tl.int64)
    row = KV + slot[:, None] * stride_kvt
    c = tl.load(row + offs_l[None, :], mask=n_mask[:, None] & l_mask[None, :],
                other=0.0).to(q_lat.dtype)
    k_rope = tl.load(row + LORA + offs_r[None, :], mask=n_mask[:, None] & r_mask[None, :],
                     other=0.0).to(q_lat.dtype)
    s = tl.dot(q_lat, tl.trans(c), input_precision=DOT_PREC)
    s += tl.dot(q_rope, tl.trans(k_rope), input_precision=DOT_PREC)
    return s, c


@triton.jit
def _mla_decode_partial_kernel(
    Q, KV, kv_indptr, kv_indices, num_kv_splits, Mid_O, Mid_LSE, sm_scale_log2,
    stride_qb, stride_qh, stride_kvt, stride_mob, stride_moh, stride_mos, stride_mlb,
    stride_mlh, num_heads,
    LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)   # the latents, the query and the index lists are this step's
    b = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    kv_start, lo, hi = split_range(kv_indptr, num_kv_splits, b, split, BLOCK_N)
    if lo < hi:
        heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_l = tl.arange(0, BLOCK_L)
        offs_r = tl.arange(0, BLOCK_R)
        offs_n = tl.arange(0, BLOCK_N)
        h_mask = heads < num_heads
        l_mask = offs_l < LORA
        r_mask = offs_r < ROPE
        q_row = Q + b * stride_qb + heads[:, None] * stride_qh
        q_lat = tl.load(q_row + offs_l[None, :], mask=h_mask[:, None] & l_mask[None, :],
                        other=0.0)
        q_rope = tl.load(q_row + LORA + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :],
                         other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_L], dtype=tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < hi
            s, c = _latent_tile_scores(q_lat, q_rope, KV, kv_indices, kv_start, pos, n_mask,
                                       stride_kvt, offs_l, offs_r, l_mask, r_mask, LORA,
                                       DOT_PREC)
            s = tl.where(n_mask[None, :], s * sm_scale_log2, float("-inf"))
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, c, DOT_PREC)
        o_ptrs = (Mid_O + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos
                  + offs_l[None, :])
        tl.store(o_ptrs, acc / l_i[:, None], mask=h_mask[:, None] & l_mask[None, :])
        tl.store(Mid_LSE + b * stride_mlb + heads * stride_mlh + split, m_i + tl.log2(l_i),
                 mask=h_mask)


def mla_block_h(num_heads: int) -> int:
    """Query heads per decode program (each latent tile is loaded once for all of them)."""
    return 16 if num_heads <= 16 else 32 if num_heads % 32 == 0 or num_heads > 64 else 16


def mla_decode_programs_per_request(num_heads: int) -> int:
    """Head blocks per request in the decode grid: what the split heuristic multiplies by
    (the pool's single latent "head" would undercount it)."""
    return triton.cdiv(num_heads, mla_block_h(num_heads))


def mla_decode_block_n(lora: int, dtype: torch.dtype) -> int:
    return 32 if block_dmodel(lora) * dtype.itemsize > 256 else 64


def mla_decode_attention(q: torch.Tensor, kv_buf: torch.Tensor, out: torch.Tensor, lora: int,
                         kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                         num_kv_splits: torch.Tensor, max_kv_splits: int, sm_scale: float,
                         buffers: SplitKVBuffers, block_n: int | None = None,
                         num_warps: int | None = None, num_stages: int = 2) -> torch.Tensor:
    """q [B, H, LORA+ROPE]; kv_buf [slots, 1, LORA+ROPE]; out [B, H, LORA]. buffers from
    alloc_decode_buffers(B, H, LORA, >= max_kv_splits)."""
    bs, hq, d = q.shape
    rope = d - lora
    mid_o, mid_lse = buffers.mid_o, buffers.mid_lse
    assert q.stride(-1) == 1 and kv_buf.stride(-1) == 1 and max_kv_splits <= mid_o.shape[2]
    if bs == 0:
        return out
    block_l, block_r = block_dmodel(lora), block_dmodel(rope)
    block_h = mla_block_h(hq)
    block_n = block_n or mla_decode_block_n(lora, q.dtype)
    # 32-head blocks hold a [32, 512] float32 accumulator: 8 warps (11.6 vs 14.0 us above).
    num_warps = num_warps or (8 if block_h >= 32 else 4)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    pdl = pdl_kwargs(q.device, bs)
    _mla_decode_partial_kernel[(bs, triton.cdiv(hq, block_h), max_kv_splits)](
        q, kv_buf, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv_buf.stride(0), mid_o.stride(0), mid_o.stride(1),
        mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1), hq,
        LORA=lora, ROPE=rope, BLOCK_L=block_l, BLOCK_R=block_r, BLOCK_H=block_h,
        BLOCK_N=block_n, DOT_PREC=dot_prec, num_warps=num_warps, num_stages=num_stages, **pdl)
    _decode_reduce_kernel[(bs, hq)](
        mid_o, mid_lse, kv_indptr, num_kv_splits, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=lora, BLOCK_D=block_l, BLOCK_S=next_pow2(max_kv_splits), BLOCK_N=block_n,
        num_warps=4, **pdl)
    return out


@triton.jit
def _mla_extend_kernel(
    Q, KV, Out, qo_indptr, kv_indptr, kv_indices, sm_scale_log2,
    stride_qt, stride_qh, stride_kvt, stride_ot, stride_oh,
    LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
):
    b = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.program_id(2)
    qo_start = tl.load(qo_indptr + b)
    ext_len = tl.load(qo_indptr + b + 1) - qo_start
    kv_start = tl.load(kv_indptr + b)
    seq_len = tl.load(kv_indptr + b + 1) - kv_start
    prefix = seq_len - ext_len
    if block * BLOCK_M < ext_len:
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_l = tl.arange(0, BLOCK_L)
        offs_r = tl.arange(0, BLOCK_R)
        offs_n = tl.arange(0, BLOCK_N)
        m_mask = offs_m < ext_len
        l_mask = offs_l < LORA
        r_mask = offs_r < ROPE
        q_row = Q + (qo_start + offs_m)[:, None].to(tl.int64) * stride_qt + head * stride_qh
        q_lat = tl.load(q_row + offs_l[None, :], mask=m_mask[:, None] & l_mask[None, :],
                        other=0.0)
        q_rope = tl.load(q_row + LORA + offs_r[None, :], mask=m_mask[:, None] & r_mask[None, :],
                         other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.float32)
        # Keys up to the last visible one of this block's last query.
        hi = tl.minimum(prefix + (block + 1) * BLOCK_M, seq_len)
        for start in range(0, hi, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < hi
            s, c = _latent_tile_scores(q_lat, q_rope, KV, kv_indices, kv_start, pos, n_mask,
                                       stride_kvt, offs_l, offs_r, l_mask, r_mask, LORA,
                                       DOT_PREC)
            visible = (pos[None, :] <= prefix + offs_m[:, None]) & n_mask[None, :]
            s = tl.where(visible, s * sm_scale_log2, float("-inf"))
            # Key 0 is visible to every query, so the first tile makes every row finite.
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, c, DOT_PREC)
        o_ptrs = (Out + (qo_start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh
                  + offs_l[None, :])
        tl.store(o_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty),
                 mask=m_mask[:, None] & l_mask[None, :])


def mla_extend_attention(q: torch.Tensor, kv_buf: torch.Tensor, out: torch.Tensor, lora: int,
                         qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                         kv_indices: torch.Tensor, max_extend_len: int, sm_scale: float,
                         block_m: int | None = None, block_n: int | None = None,
                         num_warps: int | None = None, num_stages: int = 1) -> torch.Tensor:
    """q [T, H, LORA+ROPE] (request b's new tokens are q[qo_indptr[b]:qo_indptr[b+1]]);
    kv_buf [slots, 1, LORA+ROPE] already holding the new tokens; request b's keys, prefix and
    new, are the slots kv_indices[kv_indptr[b]:kv_indptr[b+1]]. out [T, H, LORA]."""
    t, hq, d = q.shape
    rope = d - lora
    bs = qo_indptr.numel() - 1
    if t == 0 or bs == 0:
        return out
    block_l, block_r = block_dmodel(lora), block_dmodel(rope)
    wide = block_l >= 256
    # bf16: 64 x 64 tiles with 8 warps, 166 TFLOP/s on an H200 at 4k (vs 69 with 32 x 32;
    # `radixlm bench moe --parts mla-extend`). fp32 tiles of a 512-wide latent that size
    # overflow shared memory, so fp32 takes 32 x 32.
    small = wide and q.dtype.itemsize >= 4
    block_m = block_m or (32 if small else 64)
    block_n = block_n or (32 if small else 64)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (bs, hq, triton.cdiv(max_extend_len, block_m))
    _mla_extend_kernel[grid](
        q, kv_buf, out, qo_indptr, kv_indptr, kv_indices, sm_scale * LOG2E,
        q.stride(0), q.stride(1), kv_buf.stride(0), out.stride(0), out.stride(1),
        LORA=lora, ROPE=rope, BLOCK_L=block_l, BLOCK_R=block_r, BLOCK_M=block_m,
        BLOCK_N=block_n, DOT_PREC=dot_prec, num_warps=num_warps or (8 if wide else 4),
        num_stages=num_stages)
    return out
