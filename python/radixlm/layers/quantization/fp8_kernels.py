"""FP8 weight matmuls: a Triton weight-only kernel for small batches, `torch._scaled_mm` for
large ones, and the torch reference both are tested against.

At batch 1-64 a linear layer is bound by reading its weight: the Triton kernel reads each FP8
byte once, widens it to the activation dtype in registers and multiplies with `tl.dot`, so the
bytes read halve against bf16. Library FP8 GEMMs (cuBLASLt through `_scaled_mm`) need FP8
activations too and reach only bf16 speed at small M (measured in the issue); at large M they
run the tensor cores at FP8 rate, so prefill takes them, with each token's activations
quantized on the fly (one scale per token, `quantize_per_token`).

Scales: one per output channel [N] (online quantization, per-tensor checkpoints expanded), or
one per (block_n x block_k) block [ceil(N/bn), ceil(K/bk)] (DeepSeek-V3-style checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.layers.quantization.spec import FP8_MAX
from radixlm.layers.quantization.split_k import SplitKScratch, split_k_total

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class GemmTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1        # programs sharing one output tile, each a slice of K (fp32 atomics)
    gemv: bool = False      # one row per program, multiply-and-reduce without tensor cores


def fp8_tiles(m: int, n: int, k: int, block: tuple[int, int] | None) -> GemmTiles:
    """Default tiles of `fp8_weight_gemm`, from `bench quant --parts sweep` on an H200
    (Llama-3.1-8B shapes). One row: the CUDA-core kernel with deep K tiles, K split for the
    long down projection; more rows: tensor-core tiles, K split unless N alone fills the GPU."""
    if m <= 2:
        # 16 x 2048 tiles (32 KiB of weight per load): enough bytes in flight per SM.
        bk = min(2048, block[1]) if block else 2048
        return GemmTiles(1, 16, bk, 4, 3, split_k=4 if k >= 8192 else 1, gemv=True)
    bk = min(256, block[1]) if block else 256
    wide = n >= 16384
    return GemmTiles(max(16, triton.next_power_of_2(m)), 32 if wide else 64, bk, 4, 3,
                     split_k=1 if wide else (4 if m <= 16 else 2))


def launch_split(m: int, n: int, k: int, tiles: GemmTiles, dtype: torch.dtype,
                 device: torch.device, launch, scratch: SplitKScratch | None = None
                 ) -> torch.Tensor:
    """Run `launch(out, grid, scratch)` over the grid of `tiles` and return the [m, n] result
    in `dtype`. Split-K programs meet in `scratch` where it fits (split_k.py: no extra
    launch); without one, they add fp32 partial sums into a zeroed buffer, cast at the end."""
    rows = m if tiles.gemv else triton.cdiv(m, tiles.block_m)
    grid = (rows, triton.cdiv(n, tiles.block_n), tiles.split_k)
    if tiles.split_k == 1 or (scratch is not None and scratch.fits(m, n, tiles.block_n)):
        out = torch.empty((m, n), dtype=dtype, device=device)
        launch(out, grid, scratch if tiles.split_k > 1 else None)
        return out
    acc = torch.zeros((m, n), dtype=torch.float32, device=device)
    launch(acc, grid, None)
    return acc.to(dtype)


def scratch_args(y: torch.Tensor, scratch: SplitKScratch | None
                 ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The kernels' split-K arguments (part_ptr, count_ptr, SCRATCH): the scratch's buffers,
    or stand-ins the kernel does not touch."""
    if scratch is None:
        return y, y, False
    return scratch.partials, scratch.counters, True


@triton.jit
def _k_range(K, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """[start, end) of the K slice of program_id(2), a whole number of BLOCK_K tiles."""
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    start = tl.program_id(2) * per
    return start, tl.minimum(start + per, K)


@triton.jit
def _store_split(y_ptr, part_ptr, count_ptr, offs_m, offs_n, stride_ym, N, acc, mask,
                 SPLIT_K: tl.constexpr, SCRATCH: tl.constexpr):
    """Store the tile [offs_m, offs_n]: directly without a split; split, through the scratch
    (the last program stores, split_k.py) or by fp32 atomics into the zeroed output."""
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=mask)
    elif SCRATCH:
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        last, total = split_k_total(part_ptr + offs_m[:, None] * N + offs_n[None, :],
                                    count_ptr + tile, acc, mask, SPLIT_K)
        if last:
            tl.store(y_ptrs, total.to(y_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=mask, sem="relaxed")


@triton.jit
def _fp8_weight_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, M, N, K,
                            stride_xm, stride_wn, stride_ym, stride_sn, SCRATCH: tl.constexpr,
                            SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                            BLOCK_SCALES: tl.constexpr, IEEE: tl.constexpr,
                            SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[M, N] = x[M, K] @ (w[N, K] * scale)^T on the tensor cores. Channel scales are
    applied once at the end; block scales to each K tile's partial product (BLOCK_K divides
    SCALE_BK)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start, k_end = _k_range(K, SPLIT_K, BLOCK_K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if IEEE:
            part = tl.dot(x, w.to(x.dtype), input_precision="ieee")
        else:
            part = tl.dot(x, w.to(x.dtype))
        if BLOCK_SCALES:
            s = tl.load(s_ptr + (offs_n // SCALE_BN) * stride_sn + k0 // SCALE_BK,
                        mask=n_mask, other=0.0)
            acc += part * s[None, :]
        else:
            acc += part
    if not BLOCK_SCALES:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    _store_split(y_ptr, part_ptr, count_ptr, offs_m, offs_n, stride_ym, N, acc,
                 m_mask[:, None] & n_mask[None, :], SPLIT_K, SCRATCH)


@triton.jit
def _fp8_weight_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, count_ptr, N, K,
                            stride_xm, stride_wn, stride_ym, stride_sn, SCRATCH: tl.constexpr,
                            SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                            BLOCK_SCALES: tl.constexpr, SPLIT_K: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x per program: each weight tile [BLOCK_N, BLOCK_K] (K contiguous, wide
    vector loads) is widened, multiplied by x and reduced along K on the CUDA cores."""
    m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_start, k_end = _k_range(K, SPLIT_K, BLOCK_K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        part = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if BLOCK_SCALES:
            part *= tl.load(s_ptr + (offs_n // SCALE_BN) * stride_sn + k0 // SCALE_BK,
                            mask=n_mask, other=0.0)
        acc += part
    if not BLOCK_SCALES:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    rows = m + tl.arange(0, 1)
    _store_split(y_ptr, part_ptr, count_ptr, rows, offs_n, stride_ym, N, acc[None, :],
                 n_mask[None, :], SPLIT_K, SCRATCH)


def fp8_weight_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                    block: tuple[int, int] | None = None, tiles: GemmTiles | None = None,
                    scratch: SplitKScratch | None = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) times the FP8 weight w [N, K] with `scale` ([N] per channel,
    or [ceil(N/bn), ceil(K/bk)] for `block` (bn, bk)): [M, N] in x's dtype. `scratch`: the
    layer's split-K buffers (split_k.py)."""
    m, k = x.shape
    n = w.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles or fp8_tiles(m, n, k, block)
    if block is not None and block[1] % tiles.block_k:
        raise ValueError(f"BLOCK_K {tiles.block_k} must divide the scale block {block[1]}")
    scales = dict(SCALE_BN=block[0] if block else 1, SCALE_BK=block[1] if block else 1,
                  BLOCK_SCALES=block is not None, SPLIT_K=tiles.split_k,
                  BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
                  num_stages=tiles.num_stages)
    s_stride = scale.stride(0) if block else 0

    def launch(y: torch.Tensor, grid, scratch: SplitKScratch | None) -> None:
        part, count, use_scratch = scratch_args(y, scratch)
        if tiles.gemv:
            _fp8_weight_gemv_kernel[grid](x, w, scale, y, part, count, n, k, x.stride(0),
                                          w.stride(0), y.stride(0), s_stride,
                                          SCRATCH=use_scratch, **scales)
        else:
            _fp8_weight_gemm_kernel[grid](x, w, scale, y, part, count, m, n, k, x.stride(0),
                                          w.stride(0), y.stride(0), s_stride,
                                          SCRATCH=use_scratch, IEEE=x.dtype == torch.float32,
                                          BLOCK_M=tiles.block_m, **scales)

    return launch_split(m, n, k, tiles, x.dtype, x.device, launch, scratch)


@triton.jit
def _quantize_per_token_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                               FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    """One row: scale = max|x| / FP8_MAX, q = x / scale in FP8. Two passes over the row, the
    second from L2."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / FP8_MAX
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (FP8 [M, K], fp32 scales [M, 1]) with x ~= q * scale row by row."""
    m, k = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    _quantize_per_token_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), FP8_MAX=FP8_MAX,
                                     BLOCK=min(4096, triton.next_power_of_2(k)))
    return q, s


@triton.jit
def _quantize_per_token_group_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s,
                                     FP8_MAX: tl.constexpr, GROUP: tl.constexpr):
    """One (row, group of GROUP inputs): scale = max|x| / FP8_MAX, q = x / scale in FP8."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    offs = g * GROUP + tl.arange(0, GROUP)
    ok = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / FP8_MAX
    tl.store(s_ptr + row * stride_s + g, scale)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=ok)


def quantize_per_token_group(x: torch.Tensor, group: int = 128
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (FP8 [M, K], fp32 scales [M, ceil(K/group)]): each row's runs of `group`
    inputs scaled on their own (DeepSeek-V3's activation quantization for block-scaled
    weights; finer than one scale per row)."""
    m, k = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    groups = triton.cdiv(k, group)
    s = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    if m:
        _quantize_per_token_group_kernel[(m, groups)](
            x, q, s, k, x.stride(0), q.stride(0), s.stride(0), FP8_MAX=FP8_MAX, GROUP=group)
    return q, s


def dequantize_per_token_group(q: torch.Tensor, s: torch.Tensor, group: int,
                               dtype: torch.dtype) -> torch.Tensor:
    """The reference inverse of quantize_per_token_group."""
    k = q.shape[1]
    return (q.float() * s.repeat_interleave(group, dim=1)[:, :k]).to(dtype)


def scaled_mm_per_token(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """The large-batch path: FP8 activations (per-token scales) x FP8 weight (per-channel
    scales) on the FP8 tensor cores, bias fused, output in x's dtype."""
    xq, xs = quantize_per_token(x)
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=scale.view(1, -1), bias=bias,
                            out_dtype=x.dtype)


# ---------------------------------------------------------------------- references

def expand_block_scales(scale: torch.Tensor, block: tuple[int, int], n: int,
                        k: int) -> torch.Tensor:
    """[ceil(N/bn), ceil(K/bk)] block scales -> one per element [N, K]."""
    return (scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k])


def dequantize_fp8(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """The FP8 weight in `dtype`: what every path computes with (reference and CPU path)."""
    n, k = w.shape
    s = expand_block_scales(scale, block, n, k) if block else scale.view(-1, 1)
    return (w.to(torch.float32) * s).to(dtype)


def quantize_fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Online quantization of a full-precision [N, K] weight: (FP8 weight, fp32 scales [N]),
    each row scaled so that its largest magnitude maps to the largest FP8 value."""
    scale = w.abs().amax(dim=1).float().clamp(min=1e-12) / FP8_MAX
    q = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale
