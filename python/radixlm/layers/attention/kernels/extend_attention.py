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

On Hopper the new tokens' Q/K/V tiles are copied by the TMA unit (tensor descriptors over the
[T, heads * D] rows, `tma_fits`): no per-row address math or index registers, and a deeper
pipeline for the same registers; 4 x 4k causal at head_dim 128 went from 385-389 to 439-461
TFLOP/s, at 64 from 302-317 to 341-365 (H200, same runs; `extend_config`). The cached prefix
stays a gather (its slots are scattered), as do other GPUs and layouts, small batches and
batches whose requests end inside a key tile (`uses_tma`).

Grid: (num_heads, cdiv(max_extend_len, BLOCK_M), batch). Heads vary fastest so the GQA heads
sharing a K/V head run side by side and hit the same K/V tiles in L2. Query blocks are visited
last-first: under the causal mask the last block of a request does the most work, and starting
the heaviest programs first shortens the tail of the launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.3); without them tiles are always gathered
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

from radixlm.layers.attention.kernels.common import block_dmodel, max_shared_memory

LOG2E = 1.4426950408889634


@triton.jit
def _fold_tile(acc, m_i, l_i, qk, scale, v, DOT_PREC: tl.constexpr):
    """Fold one tile of raw scores qk [M, N] (masked entries -inf) and values v [N, D] into the
    running state; `scale` turns qk into base-2 logits. The scale rides in the exponent's FMA
    (qk * scale - m) rather than a pass of its own over the tile, and P @ V accumulates into acc
    in place (one tensor-core accumulator, no separate sum). Callers guarantee every row has
    seen a finite score by now."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    p = tl.exp2(qk * scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, DOT_PREC: tl.constexpr):
    """`_fold_tile` for scores already scaled to base-2 logits (the MLA kernels)."""
    return _fold_tile(acc, m_i, l_i, s, 1.0, v, DOT_PREC)


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
    TMA: tl.constexpr,
):
    """With TMA, Q / K_new / V_new are tensor descriptors over [T, heads * D] (see
    `_descriptor`) and their tiles are copied by the TMA unit (BLOCK_D == HEAD_DIM then);
    otherwise they are pointers and tiles are gathered row by row."""
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

        # Rows past this request belong to the next one (or lie past T: zeros). Their queries
        # are computed and never stored; their keys are masked out below. With TMA the values
        # of such rows are not zeroed (their p is 0, but 0 * inf is nan): the host takes this
        # path only where no request but the last ends inside a key tile (`tma_safe_lens`).
        if TMA:
            q = Q.load([qo_start + block_lo, head * HEAD_DIM])
        else:
            q = tl.load(Q + (qo_start + offs_m)[:, None].to(tl.int64) * stride_qt
                        + head * stride_qh + offs_d[None, :],
                        mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # 1) The cached prefix: every query sees all of it; only the last tile is partial.
        for start in range(0, prefix_len, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < prefix_len
            slot = tl.load(kv_indices + prefix_start + pos, mask=n_mask,
                           other=0).to(tl.int64)
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K_buf + slot[:, None] * stride_kt + kv_head * stride_kh
                        + offs_d[None, :], mask=kv_mask, other=0.0)
            qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PREC)
            qk = tl.where(n_mask[None, :], qk, float("-inf"))
            v = tl.load(V_buf + slot[:, None] * stride_vt + kv_head * stride_vh
                        + offs_d[None, :], mask=kv_mask, other=0.0)
            acc, m_i, l_i = _fold_tile(acc, m_i, l_i, qk, prefix_scale_log2, v.to(q.dtype),
                                       DOT_PREC)
        # So far acc sums p * (stored v): scaled once here it sums p * v; the rescaling by
        # later tiles (acc * alpha) is linear, so the order does not matter.
        acc = acc * v_scale

        # 2) New tokens strictly before this query block: all visible, no mask but head_dim's.
        if not TMA:
            k_base = K_new + kv_head * stride_knh + offs_d[None, :]
            v_base = V_new + kv_head * stride_vnh + offs_d[None, :]
        for start in range(0, block_lo, BLOCK_N):
            if TMA:
                k = K_new.load([qo_start + start, kv_head * HEAD_DIM])
                v = V_new.load([qo_start + start, kv_head * HEAD_DIM])
            else:
                rows = (qo_start + start + offs_n).to(tl.int64)
                k = tl.load(k_base + rows[:, None] * stride_knt, mask=d_mask[None, :], other=0.0)
                v = tl.load(v_base + rows[:, None] * stride_vnt, mask=d_mask[None, :], other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            acc, m_i, l_i = _fold_tile(acc, m_i, l_i, qk, sm_scale_log2, v, DOT_PREC)

        # 3) The diagonal: key j is visible to query i iff j <= i. Key block_lo is visible to
        #    every row of this block, so no row is all -inf after the first diagonal tile.
        hi = tl.minimum(block_lo + BLOCK_M, ext_len)
        for start in range(block_lo, hi, BLOCK_N):
            pos = start + offs_n
            n_mask = pos < ext_len
            if TMA:
                k = K_new.load([qo_start + start, kv_head * HEAD_DIM])
                v = V_new.load([qo_start + start, kv_head * HEAD_DIM])
            else:
                rows = (qo_start + pos).to(tl.int64)
                kv_mask = n_mask[:, None] & d_mask[None, :]
                k = tl.load(k_base + rows[:, None] * stride_knt, mask=kv_mask, other=0.0)
                v = tl.load(v_base + rows[:, None] * stride_vnt, mask=kv_mask, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            visible = (pos[None, :] <= offs_m[:, None]) & n_mask[None, :]
            qk = tl.where(visible, qk, float("-inf"))
            acc, m_i, l_i = _fold_tile(acc, m_i, l_i, qk, sm_scale_log2, v, DOT_PREC)

        out = acc / l_i[:, None]
        tl.store(Out + (qo_start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh
                 + offs_d[None, :], out.to(Out.dtype.element_ty),
                 mask=m_mask[:, None] & d_mask[None, :])


# Shared memory the head-dim-128 tiles need with 3 pipeline stages (a 128 x 128 query tile
# plus 3 K and 3 V tiles of 64 x 128, 16-bit: 128 KiB), with room for Triton's own buffers.
_SMEM_FOR_3_STAGES_HD128 = 160 * 1024


def extend_config(head_dim: int, dtype: torch.dtype, shared_memory: int | None = None,
                  tma: bool = False) -> dict[str, int]:
    """Tile sizes for an H100-class GPU (228 KiB shared memory per SM).

    BLOCK_M=128 x BLOCK_N=64 keeps the tensor cores busy for head_dim <= 128 in 16-bit types;
    head_dim 128 needs 8 warps for the 128x128 fp32 accumulator to fit in registers. Wider heads
    and fp32 inputs double the bytes per tile, so they halve the tiles. Measured on an H200
    (`python -m radixlm.bench.extend_kernel`, benchmarks/results/issue12/):
      * tiles by TMA (`tma`, Hopper): 64 x 64 with 4 warps and 3 stages for head_dim 64 and
        128 (4 x 4k causal: 341-365 and 439-461 TFLOP/s, where the gathered tiles below ran
        302-317 and 385-389 in the same runs; 16k: 419-429 and 496-499 against 402-406 and
        449). Other tiles swung by 10-30% between compiles of nearly the same kernel
        (`benchmarks/results/issue12/extend_tma/`); this one was among the best every time;
      * gathered tiles: head_dim 128 with 3 stages instead of 2 went from 355 to 392 TFLOP/s
        (4 x 4k causal) and 349 to 450 (16k); head_dim 64 with 4 warps (311-344).
    GPUs with less shared memory per program (`shared_memory`, bytes; sm_86 / sm_89 have 99 KiB)
    keep 2 stages for head_dim 128.
    """
    block_d = block_dmodel(head_dim)
    if dtype == torch.float32 or block_d > 128:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4 if block_d <= 64 else 8, num_stages=2)
    if tma:
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    if block_d <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    roomy = shared_memory is None or shared_memory >= _SMEM_FOR_3_STAGES_HD128
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3 if roomy else 2)


# TMA pays off only where the kernel runs long: building the three descriptors and encoding them
# at launch costs ~10-20 us of host time a call (every layer), while a few hundred new tokens'
# attention takes microseconds. T x max_extend_len bounds the scores computed (x2 for causal).
_TMA_MIN_SCORES = 2048 * 2048


@functools.lru_cache(maxsize=None)
def _is_hopper(device_index: int) -> bool:
    # Hopper only: the tiles were measured there, and later GPUs differ (sm_120 has 99 KiB of
    # shared memory, short of the 112 KiB the head_dim-128 tiles take with 3 stages).
    return torch.cuda.get_device_capability(device_index)[0] == 9


def tma_layout_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether q / k / v can be read through `_descriptor`: 16-bit values, head_dim 64 or 128
    (the measured tiles), each laid out as rows of heads * head_dim contiguous values (a view of
    the fused QKV projection is) with the 16-byte alignment TMA needs."""
    d = q.shape[2]
    if TensorDescriptor is None or q.dtype not in (torch.float16, torch.bfloat16) \
            or d not in (64, 128):
        return False
    return all(x.dtype == q.dtype and x.shape[2] == d and x.stride(2) == 1 and x.stride(1) == d
               and (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0
               for x in (q, k, v))


def tma_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the new tokens' tiles can be copied by TMA here: a Hopper GPU and a layout
    `tma_layout_fits`."""
    if q.device.type != "cuda":
        return False
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return _is_hopper(index) and tma_layout_fits(q, k, v)


def tma_safe_lens(extend_lens: list[int], block_n: int) -> bool:
    """Whether every request but the last ends on a key-tile boundary. A TMA tile is not masked
    row by row: a request ending inside its last key tile reads the next request's V rows
    there, whose weights are 0 but whose inf or nan would still turn its output into nan (the
    gathered loads zero such rows). Past the last request the tile reads zeros."""
    return all(n % block_n == 0 for n in extend_lens[:-1])


def uses_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_extend_len: int,
             extend_lens: list[int] | None, block_n: int | None = None) -> bool:
    """`extend_attention`'s default: TMA where it fits, the batch is big enough to gain, and the
    requests' lengths (`extend_lens`; unknown: no) keep them apart (`tma_safe_lens`). One
    long prompt always qualifies; a batch of prompts whose lengths are multiples of 64 too."""
    if extend_lens is None or q.shape[0] * max_extend_len < _TMA_MIN_SCORES:
        return False
    tile = block_n or extend_config(q.shape[2], q.dtype, tma=True)["BLOCK_N"]
    return tma_safe_lens(extend_lens, tile) and tma_fits(q, k, v)


def _descriptor(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """[T, H, D] as a 2-D [T, H * D] descriptor with [rows, D] tiles: head h's tile of rows
    r.. is at [r, h * D]. Rows past T read as zeros."""
    t, h, d = x.shape
    return TensorDescriptor(x, shape=[t, h * d], strides=[x.stride(0), 1], block_shape=[rows, d])


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                     k_buf: torch.Tensor, v_buf: torch.Tensor, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, max_extend_len: int,
                     sm_scale: float, block_m: int | None = None,
                     block_n: int | None = None, k_scale: float = 1.0,
                     v_scale: float = 1.0, num_warps: int | None = None,
                     num_stages: int | None = None, tma: bool | None = None,
                     extend_lens: list[int] | None = None) -> torch.Tensor:
    """q/out [T, Hq, D]; k/v [T, Hk, D] (this step's new tokens); k_buf/v_buf [slots, Hk, D].
    Request b's queries are rows qo_indptr[b]:qo_indptr[b+1]; its cached prefix is the slots
    kv_indices[kv_indptr[b]:kv_indptr[b+1]] (the new tokens' slots are not in that list).
    k_scale/v_scale: what the pool's values are multiplied by (an fp8 pool's scales).
    tma: copy the new tokens' tiles by TMA (None: `uses_tma`, given the host's `extend_lens`,
    the requests' new-token counts; True where the layout does not fit is an error; tests force
    it under the interpreter)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    assert hq % hk == 0, f"{hq} query heads are not a multiple of {hk} KV heads"
    for x in (q, k, v, out, k_buf, v_buf):
        assert x.stride(-1) == 1, "the head dimension must be contiguous"
    bs = qo_indptr.numel() - 1
    if t == 0 or bs == 0:
        return out
    if tma is None:
        tma = uses_tma(q, k, v, max_extend_len, extend_lens, block_n)
    cfg = extend_config(d, q.dtype, max_shared_memory(q.device), tma=tma)
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
    qa, ka, va = q, k, v
    if tma:
        assert tma_layout_fits(q, k, v), "tma=True: q / k / v do not fit a TMA descriptor"
        assert extend_lens is None or tma_safe_lens(extend_lens, cfg["BLOCK_N"]), \
            "tma=True: a request other than the last ends inside a key tile"
        qa, ka, va = (_descriptor(q, cfg["BLOCK_M"]), _descriptor(k, cfg["BLOCK_N"]),
                      _descriptor(v, cfg["BLOCK_N"]))
    grid = (hq, triton.cdiv(max_extend_len, cfg["BLOCK_M"]), bs)
    _extend_kernel[grid](
        qa, ka, va, out, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
        sm_scale * LOG2E, sm_scale * LOG2E * k_scale, v_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        GROUP=hq // hk, HEAD_DIM=d, BLOCK_D=block_dmodel(d),
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", TMA=tma, **cfg,
    )
    return out
