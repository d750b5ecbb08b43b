"""4-bit weight matmuls (W4A16): the packed layout every INT4 format is repacked into, a Triton
kernel that unpacks in registers for small batches, and a dequantize-then-GEMM path for large.

Layout (the same whatever the checkpoint was: AWQ, GPTQ or quantized at load):
    qweight [K/8, N] int32   eight consecutive inputs k = 8r..8r+7 of output n in word (r, n),
                             input 8r+j in bits 4j..4j+3 (GPTQ's own order)
    scales  [G, N] fp32      G = ceil(K / group): one per group of `group` inputs
    zeros   [G, N] uint8     zero points, 0..16 (GPTQ v1 checkpoints reach 16)
    w[k, n] = (q[k, n] - zeros[k // group, n]) * scales[k // group, n]

A word holds eight inputs of one output, so a [BLOCK_K/8, BLOCK_N] tile of words is read once,
coalesced along N; its nibble j is the weight's rows 8r + j, multiplied by x's matching inputs
(no reshuffle into k order). Within a K tile (BLOCK_K divides the group size) the scale and
zero are one row, so the kernels multiply the small integers (q - z, exact in bf16) by x and
apply the scale to the partial product, once per output rather than once per weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.layers.quantization.fp8_kernels import (GemmTiles, _k_range, _store_split,
                                                     launch_split, scratch_args)
from radixlm.layers.quantization.split_k import SplitKScratch

PACK = 8                 # 4-bit values per int32 word


@triton.jit
def _minus_zero(q, z, dtype: tl.constexpr):
    """q - z (both 0..16) in `dtype` without integer-to-float conversions, whose throughput
    would bound the kernel: OR-ing a small integer into the mantissa of a power of two gives
    that power plus the integer as a float's bits (2^23 in fp32, 1024 in fp16, 128 in bf16),
    and the powers cancel exactly in the subtraction."""
    if dtype == tl.float32:
        fq = (q | 0x4B000000).to(tl.float32, bitcast=True)
        fz = (z | 0x4B000000).to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        fq = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
        fz = (z | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        fq = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
        fz = (z | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return fq - fz


@triton.jit
def _w4a16_gemm_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, M, N, K,
                       stride_xm, stride_ym, SCRATCH: tl.constexpr, GROUP: tl.constexpr,
                       IEEE: tl.constexpr,
                       SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """Tensor-core tiles: the [BLOCK_K/8, BLOCK_N] words are spread into [BLOCK_K/8, 8,
    BLOCK_N] nibbles and reshaped into the [BLOCK_K, BLOCK_N] weight tile (one tl.dot per
    tile; eight dots, one per nibble, measured 2-7x slower). BLOCK_K divides GROUP."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start, k_end = _k_range(K, SPLIT_K, BLOCK_K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(qw_ptr + rows[:, None].to(tl.int64) * N + offs_n[None, :],
                        mask=(rows < K // 8)[:, None] & n_mask[None, :], other=0)
        # Input 8r + j is nibble j of word r: the row-major reshape gives k order.
        q = (words[:, None, :] >> shifts[None, :, None]) & 0xF
        q = tl.reshape(q, (BLOCK_K, BLOCK_N))
        g = k0 // GROUP
        z = tl.load(z_ptr + g * N + offs_n, mask=n_mask, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * N + offs_n, mask=n_mask, other=0.0)
        w = _minus_zero(q, z[None, :], x.dtype)
        if IEEE:
            part = tl.dot(x, w, input_precision="ieee")
        else:
            part = tl.dot(x, w)
        acc += part * s[None, :]
    _store_split(y_ptr, part_ptr, count_ptr, offs_m, offs_n, stride_ym, N, acc,
                 m_mask[:, None] & n_mask[None, :], SPLIT_K, SCRATCH)


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, N, K,
                       stride_xm, stride_ym, SCRATCH: tl.constexpr, GROUP: tl.constexpr,
                       SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row of x per program, on the CUDA cores: each nibble j of the [BLOCK_K/8, BLOCK_N]
    words is a 2-D slice multiplied by x's inputs 8r + j and added into a 2-D accumulator,
    reduced over the rows once at the end. Tiles may span several groups (deep tiles keep
    more bytes in flight)."""
    m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    r = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    k_start, k_end = _k_range(K, SPLIT_K, BLOCK_K)
    for k0 in range(k_start, k_end, BLOCK_K):
        rows = k0 // 8 + r
        r_mask = rows < K // 8
        words = tl.load(qw_ptr + rows[:, None].to(tl.int64) * N + offs_n[None, :],
                        mask=r_mask[:, None] & n_mask[None, :], other=0)
        # Each row of words lies in one group (GROUP is a multiple of 8); a deep tile spans
        # several, so the zero and scale are read per row.
        g = (rows * 8 // GROUP)[:, None] * N + offs_n[None, :]
        wmask = r_mask[:, None] & n_mask[None, :]
        z = tl.load(z_ptr + g, mask=wmask, other=0).to(tl.int32)
        s = tl.load(s_ptr + g, mask=wmask, other=0.0)
        part = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
        for j in tl.static_range(8):
            x = tl.load(x_ptr + m * stride_xm + rows * 8 + j, mask=r_mask,
                        other=0.0).to(tl.float32)
            part += _minus_zero((words >> (4 * j)) & 0xF, z, tl.float32) * x[:, None]
        acc += part * s
    _store_split(y_ptr, part_ptr, count_ptr, m + tl.arange(0, 1), offs_n, stride_ym, N,
                 tl.sum(acc, axis=0)[None, :], n_mask[None, :], SPLIT_K, SCRATCH)


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group: int, tiles: GemmTiles | None = None,
               scratch: SplitKScratch | None = None) -> torch.Tensor:
    """x [M, K] times the packed 4-bit weight: [M, N] in x's dtype. `scratch`: the layer's
    split-K buffers (split_k.py)."""
    m, k = x.shape
    n = qweight.shape[1]
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles or w4_tiles(m, n, k, group)
    nested = group % tiles.block_k == 0 or (tiles.gemv and tiles.block_k % group == 0)
    if not nested or tiles.block_k % PACK:
        raise ValueError(f"BLOCK_K {tiles.block_k} must divide the group size {group} (the "
                         f"row kernel: or be a multiple of it)")
    common = dict(GROUP=group, SPLIT_K=tiles.split_k, BLOCK_N=tiles.block_n,
                  BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
                  num_stages=tiles.num_stages)

    def launch(y: torch.Tensor, grid, scratch: SplitKScratch | None) -> None:
        part, count, use_scratch = scratch_args(y, scratch)
        if tiles.gemv:
            _w4a16_gemv_kernel[grid](x, qweight, scales, zeros, y, part, count, n, k,
                                     x.stride(0), y.stride(0), SCRATCH=use_scratch, **common)
        else:
            _w4a16_gemm_kernel[grid](x, qweight, scales, zeros, y, part, count, m, n, k,
                                     x.stride(0), y.stride(0), SCRATCH=use_scratch,
                                     IEEE=x.dtype == torch.float32, BLOCK_M=tiles.block_m,
                                     **common)

    return launch_split(m, n, k, tiles, x.dtype, x.device, launch, scratch)


def w4_tiles(m: int, n: int, k: int, group: int) -> GemmTiles:
    """Default tiles of `w4a16_gemm`, from `bench quant --parts sweep` on an H200 (Llama-3.1-8B
    shapes): one row on the CUDA cores, more on the tensor cores; K split four ways."""
    if m <= 2:
        if n >= 16384 or k >= 8192:     # gate_up, down: narrower and deeper
            return GemmTiles(1, 8, max(1024, group), 4 if n >= 16384 else 8, 3, gemv=True)
        return GemmTiles(1, 16, max(512, group), 8, 3, gemv=True)
    return GemmTiles(max(16, triton.next_power_of_2(m)), 64, min(128, group), 4, 3,
                     split_k=4 if m <= 16 else 2)


@triton.jit
def _w4_dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, K, GROUP: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """BLOCK_R rows of words -> the 8 * BLOCK_R rows of the full-precision weight [K, N] they
    hold (nibble j of word row r is weight row 8r + j); each word is read once."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < K // 8)[:, None] & (offs_n < N)[None, :]
    words = tl.load(qw_ptr + rows[:, None].to(tl.int64) * N + offs_n[None, :], mask=mask,
                    other=0)
    g = (rows * 8 // GROUP)[:, None] * N + offs_n[None, :]
    z = tl.load(z_ptr + g, mask=mask, other=0).to(tl.int32)
    s = tl.load(s_ptr + g, mask=mask, other=0.0)
    for j in tl.static_range(8):
        w = _minus_zero((words >> (4 * j)) & 0xF, z, tl.float32) * s
        tl.store(out_ptr + (rows * 8 + j)[:, None].to(tl.int64) * N + offs_n[None, :],
                 w.to(out_ptr.dtype.element_ty), mask=mask)


def w4_dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The full-precision weight [K, N] (large batches multiply by it with cuBLAS: one extra
    pass over a weight that is then reused by every row)."""
    n = qweight.shape[1]
    out = torch.empty((k, n), dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(k // PACK, 16), triton.cdiv(n, 128))
    _w4_dequant_kernel[grid](qweight, scales, zeros, out, n, k, GROUP=group, BLOCK_R=16,
                             BLOCK_N=128)
    return out


# ---------------------------------------------------------------------- torch versions

def unpack_int4_rows(words: torch.Tensor) -> torch.Tensor:
    """[R, N] int32 words -> [8R, N] int32 values, word r giving rows 8r..8r+7 (nibble j:
    row 8r + j)."""
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int32)
    vals = (words[:, None, :] >> shifts[None, :, None]) & 0xF
    return vals.reshape(-1, words.shape[1])


def pack_int4_rows(vals: torch.Tensor) -> torch.Tensor:
    """Inverse of unpack_int4_rows: [8R, N] values 0..15 -> [R, N] int32 words."""
    r, n = vals.shape[0] // PACK, vals.shape[1]
    v = vals.to(torch.int64).reshape(r, PACK, n)
    shifts = torch.arange(0, 32, 4, device=vals.device, dtype=torch.int64)
    words = (v << shifts[None, :, None]).sum(dim=1)
    # Wrap into int32's range (the top nibble sets the sign bit).
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def w4_dequantize_torch(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        group: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The same weight [K, N] with torch ops (CPU path and the kernels' reference)."""
    q = unpack_int4_rows(qweight)[:k]
    g = torch.arange(k, device=qweight.device) // group
    return ((q - zeros[g].to(torch.int32)).to(torch.float32) * scales[g]).to(dtype)


def quantize_int4_rtn(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor]:
    """Round-to-nearest 4-bit quantization of a full-precision weight [N, K], asymmetric, one
    scale and zero point per `group` inputs of each output: (qweight, scales, zeros) in the
    layout above. The last group may be partial. (Clipping each group's range to the least
    squared error was tried: KL from full precision on the bundled model rose 0.48 -> 0.59;
    the outlier weights it clips matter more than the rounding error it saves.)"""
    n, k = w.shape
    if k % PACK:
        raise ValueError(f"4-bit weights need the input size to be a multiple of {PACK}, "
                         f"got {k}")
    groups = -(-k // group)
    wt = w.t().float()                                   # [K, N]
    pad = groups * group - k
    padded = torch.cat([wt, wt[-1:].expand(pad, n)]) if pad else wt
    blocks = padded.reshape(groups, group, n)
    lo = blocks.amin(dim=1).clamp(max=0.0)               # keep 0 representable
    hi = blocks.amax(dim=1).clamp(min=0.0)
    scales = ((hi - lo) / 15.0).clamp(min=1e-10)
    zeros = torch.round(-lo / scales).clamp(0, 15)
    q = torch.round(blocks / scales[:, None, :] + zeros[:, None, :]).clamp(0, 15)
    q = q.reshape(groups * group, n)[:k].to(torch.int32)
    return pack_int4_rows(q), scales, zeros.to(torch.uint8)
