"""Extend (prefill) attention: new tokens attend to their cached prefix and causally to themselves.

FlashAttention-style: one program owns BLOCK_M query rows of one head of one request, keeps a
running max / sum / fp32 accumulator (online softmax), and streams K/V in BLOCK_N-token tiles.

Where K/V come from:
  * the cached prefix (positions [0, prefix_len)) is gathered from the KV pool through the
    flattened slot list `kv_indices[kv_indptr[b]:kv_indptr[b+1]]`;
  * the request's own new tokens are read from the contiguous k/v tensors of this forward pass
    ([T, Hk, D], rows qo_indptr[b]..), not from the pool. They hold the same values (the backend
    stores them into the pool first), but contiguous rows need no index load and can be
    prefetched linearly, which is what a long plain prefill spends its time on. With an fp8
    pool (`--kv-cache-dtype fp8_e4m3`) the new tokens attend to their exact K/V here while
    later steps see the rounded ones, as in the usual engines.

An fp8 pool holds K / k_scale and V / v_scale: prefix tiles are loaded as fp8 and converted to
the query's dtype in registers. The scales cost nothing per tile: K's is folded into the
prefix's score scale (q . (k_scale k) = k_scale (q . k)), V's multiplies the accumulator once
after the prefix (sum p (v_scale v) = v_scale sum p v). The new tokens' K/V are in the compute
dtype already and take neither. Both scales are 1.0 for other pools (exact: nothing changes).

The self-attention part is split at the diagonal: tiles entirely below the query block need no
mask; only the tiles overlapping it apply the causal mask, and tiles above it are never visited.

Grid: (num_heads, cdiv(max_extend_len, BLOCK_M), batch). Heads vary fastest so the GQA heads
sharing a K/V head run side by side and hit the same K/V tiles in L2. Query blocks are visited
last-first: under the causal mask the last block of a request does the most work, and starting
the heaviest programs first shortens the tail of the launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.layers.attention.kernels.common import block_dmodel, max_shared_memory

LOG2E = 1.4426950408889634


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, DOT_PREC: tl.constexpr):
    """Fold one tile of (already scaled and masked, base-2) scores s [M, N] and values v [N, D]
    into the running state. Callers guarantee every row has seen a finite score by now."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _extend_kernel(
    Q, K_new, V_new, Out,             # [T, Hq, D], [T, Hk, D], [T, Hk, D], [T, Hq, D]
    K_buf, V_buf,                     # pools [slots, Hk, D]
    qo_indptr, kv_indptr, kv_indices,
    sm_scale_log2,
    prefix_scale_log2, v_scale,       # for the pool's tiles: sm_scale_log2 * k_scale, v_scale
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh,
    stride_ot, stride_oh,
    stride_kt, stride_kh, stride_vt, stride_vh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
):
    head = tl.program_id(0)
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    b = tl.program_id(2)
    kv_head = head // GROUP

    qo_start = tl.load(qo_indptr + b)
    ext_len = tl.load(qo_indptr + b + 1) - qo_start
    prefix_start = tl.load(kv_indptr + b)
    prefix_len = tl.load(kv_indptr + b + 1) - prefix_start
    block_lo = m_block * BLOCK_M

    if block_lo < ext_len:  # the grid is sized for the longest request
        offs_m = block_lo + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < ext_len
        d_mask = offs_d < HEAD_DIM

        q = tl.load(Q + (qo_start + offs_m)[:, None].to(tl.int64) * stride_qt + head * stride_qh
                    + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # 1) The cached prefix: every query sees all of it; only the last tile is partial.
        for start in range(0, prefix_len, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < prefix_len
            slot = tl.load(kv_indices + prefix_start + pos, mask=n_mask, other=0).to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K_buf + slot[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC) * prefix_scale_log2
            s = tl.where(n_mask[None, :], s, float("-inf"))
            v = tl.load(V_buf + slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v.to(q.dtype), DOT_PREC)
        # So far acc sums p * (stored v): scaled once here it sums p * v; the rescaling by
        # later tiles (acc * alpha) is linear, so the order does not matter.
        acc = acc * v_scale

        # 2) New tokens strictly before this query block: all visible, no mask but head_dim's.
        k_base = K_new + kv_head * stride_knh + offs_d[None, :]
        v_base = V_new + kv_head * stride_vnh + offs_d[None, :]
        for start in range(0, block_lo, BLOCK_N):
            rows = (qo_start + start + offs_n).to(tl.int64)
            k = tl.load(k_base + rows[:, None] * stride_knt, mask=d_mask[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale_log2
            v = tl.load(v_base + rows[:, None] * stride_vnt, mask=d_mask[None, :], other=0.0)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, DOT_PREC)

        # 3) The diagonal: key j is visible to query i iff j <= i. Key block_lo is visible to
        #    every row of this block, so no row is all -inf after the first diagonal tile.
        hi = tl.minimum(block_lo + BLOCK_M, ext_len)
        for start in range(block_lo, hi, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < ext_len
            rows = (qo_start + pos).to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_base + rows[:, None] * stride_knt, mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * sm_scale_log2
            visible = (pos[None, :] <= offs_m[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
            v = tl.load(v_base + rows[:, None] * stride_vnt, mask=kv_mask, other=0.0)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, DOT_PREC)

        out = acc / l_i[:, None]
        tl.store(Out + (qo_start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh
                 + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=m_mask[:, None] & d_mask[None, :])


# Shared memory the head-dim-128 tiles need with 3 pipeline stages (a 128 x 128 query tile
# plus 3 K and 3 V tiles of 64 x 128, 16-bit: 128 KiB), with room for Triton's own buffers.
_SMEM_FOR_3_STAGES_HD128 = 160 * 1024


def extend_config(head_dim: int, dtype: torch.dtype,
                  shared_memory: int | None = None) -> dict[str, int]:
    """Tile sizes for an H100-class GPU (228 KiB shared memory per SM).

    BLOCK_M=128 x BLOCK_N=64 keeps the tensor cores busy for head_dim <= 128 in 16-bit types;
    head_dim 128 needs 8 warps for the 128x128 fp32 accumulator to fit in registers. Wider heads
    and fp32 inputs double the bytes per tile, so they halve the tiles. Measured on an H200
    (`python -m radixlm.bench.extend_kernel`, benchmarks/results/issue12/): head_dim 128 with 3
    stages instead of 2 went from 355 to 392 TFLOP/s (4 x 4k causal) and 349 to 450 (16k);
    head_dim 64 is best as it was (4 x 4k: 311-344, 16k: 403-411; PyTorch's SDPA: 369 / 466).
    GPUs with less shared memory per program (`shared_memory`, bytes; sm_86 / sm_89 have 99 KiB)
    keep 2 stages for head_dim 128.
    """
    block_d = block_dmodel(head_dim)
    if dtype == torch.float32 or block_d > 128:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4 if block_d <= 64 else 8, num_stages=2)
    if block_d <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    roomy = shared_memory is None or shared_memory >= _SMEM_FOR_3_STAGES_HD128
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3 if roomy else 2)


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     k_buf: torch.Tensor, v_buf: torch.Tensor, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, max_extend_len: int,
                     sm_scale: float, block_m: int | None = None,
                     block_n: int | None = None, k_scale: float = 1.0,
                     v_scale: float = 1.0, num_warps: int | None = None,
                     num_stages: int | None = None) -> torch.Tensor:
    """q/out [T, Hq, D]; k/v [T, Hk, D] (this step's new tokens); k_buf/v_buf [slots, Hk, D].
    Request b's queries are rows qo_indptr[b]:qo_indptr[b+1]; its cached prefix is the slots
    kv_indices[kv_indptr[b]:kv_indptr[b+1]] (the new tokens' slots are not in that list).
    k_scale/v_scale: what the pool's values are multiplied by (an fp8 pool's scales)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    assert hq % hk == 0, f"{hq} query heads are not a multiple of {hk} KV heads"
    for x in (q, k, v, out, k_buf, v_buf):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    bs = qo_indptr.numel() - 1
    if t == 0 or bs == 0:
        return out
    cfg = extend_config(d, q.dtype, max_shared_memory(q.device))
    if block_m is not None:
        cfg["BLOCK_M"] = block_m
    if block_n is not None:
        cfg["BLOCK_N"] = block_n
    if num_warps is not None:
        cfg["num_warps"] = num_warps
    if num_stages is not None:
        cfg["num_stages"] = num_stages
    # The diagonal loop starts at a query block boundary, which must also be a key tile boundary.
    assert cfg["BLOCK_M"] % cfg["BLOCK_N"] == 0
    grid = (hq, triton.cdiv(max_extend_len, cfg["BLOCK_M"]), bs)
    _extend_kernel[grid](
        q, k, v, out, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
        sm_scale * LOG2E, sm_scale * LOG2E * k_scale, v_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        GROUP=hq // hk, HEAD_DIM=d, BLOCK_D=block_dmodel(d),
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", **cfg,
    )
    return out
