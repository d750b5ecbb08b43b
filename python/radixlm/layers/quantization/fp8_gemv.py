"""One row of x times an FP8 weight: the decode step's linear layers at batch 1.

At batch 1 a linear layer only streams its weight, so an FP8 layer is as fast as its bytes are
few, provided the kernel keeps enough bytes in flight and spends few instructions on each. The
kernel follows the bf16 one (layers/kernels/gemv_kernels.py): wide unpredicated loads, a
float32 accumulator as wide as the tile, summed once after the loop, and a compile-time K. The
earlier small-M kernel (fp8_kernels.py), which reduced across its tile every iteration, read
51-84% of the copy bandwidth on the Llama-3.1-8B shapes where this one reads 56-94%, and its
block-scale path 15-70% where this one reads 51-71% (`bench quant --parts gemv`, H200).

A weight tile [BLOCK_N, CHUNKS, CHUNK] (K contiguous) is widened to float32 and multiplied by x.
Channel scales are applied once to the sums; block scales (DeepSeek-V3-style, one per scale
block of K) to x's chunks, a chunk lying inside one scale block, where the tile's rows share a
scale row (else to each product).

4-bit weights have their own one-row kernel (int4_gemv.py): at a quarter of the bf16 bytes,
they need K split across programs as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.layers.kernels.gemv_kernels import load_k_tile, silu_mul_rounded
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait


# The most rows of x the FP8 layers send here. The kernel takes any number (one program row
# each), but at two rows each row's programs read the weight from memory again: slower than
# the earlier kernel there (`bench quant --parts gemv`, H200).
GEMV_MAX_M = 1


@dataclass(frozen=True)
class Fp8GemvTiles:
    block_n: int          # weight rows per program
    chunk: int            # K elements per chunk (inside one scale block for block scales)
    chunks: int           # chunks per load: a load is chunk x chunks bytes of each row
    num_warps: int = 4


@triton.jit
def _accumulate(acc, w, x_ptrs, s_ptr, rows, first_row, stride_sn, k0, offs_k, offs_c,
                K: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                BLOCK_SCALES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                CHUNK: tl.constexpr):
    """acc + the weight tile w at columns k0.. times x's matching chunks (and block scales)."""
    x = load_k_tile(x_ptrs, k0, offs_k, K, BLOCK_K).to(tl.float32)
    if BLOCK_SCALES:
        chunk_k = k0 + offs_c * CHUNK
        if SCALE_BN % BLOCK_N == 0:
            # The tile's rows lie in one scale row (tail rows repeat row N - 1 and are
            # not stored): scale x's chunks once instead of every weight.
            s = tl.load(s_ptr + (first_row // SCALE_BN) * stride_sn + chunk_k // SCALE_BK,
                        mask=chunk_k < K, other=0.0)
            acc += w.to(tl.float32) * (x * s[:, None])[None, :, :]
        else:
            s = tl.load(s_ptr + (rows // SCALE_BN)[:, None] * stride_sn
                        + (chunk_k // SCALE_BK)[None, :], mask=(chunk_k < K)[None, :],
                        other=0.0)
            acc += w.to(tl.float32) * x[None, :, :] * s[:, :, None]
    else:
        acc += w.to(tl.float32) * x[None, :, :]
    return acc


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, stride_xm, stride_wn, stride_ym,
                     stride_sn, K: tl.constexpr, SCALE_BN: tl.constexpr,
                     SCALE_BK: tl.constexpr, BLOCK_SCALES: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
                     CHUNK: tl.constexpr, GATED: tl.constexpr = False,
                     PDL: tl.constexpr = False):
    """y[m, n] = sum_k x[m, k] w[n, k] scale (+ b[n]) for BLOCK_N consecutive n of row m.
    With PDL the first weight tile is requested before waiting for the kernel that writes x
    (utils/pdl.py).

    GATED: w is [gate | up], 2N rows; the program also takes up's rows n + N (their own
    scales) and stores silu(gate) * up, rounded as the unfused path rounds it (no bias)."""
    pdl_launch_dependents(PDL)
    m = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # Rows past N read row N - 1 again (their sums are never stored): unpredicated loads.
    rows = tl.minimum(offs_n, N - 1)
    first_row = tl.program_id(1) * BLOCK_N
    BLOCK_K: tl.constexpr = CHUNKS * CHUNK
    offs_c = tl.arange(0, CHUNKS)
    offs_k = offs_c[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]          # [CHUNKS, CHUNK]
    w_ptrs = w_ptr + rows[:, None, None].to(tl.int64) * stride_wn + offs_k[None, :, :]
    x_ptrs = x_ptr + m * stride_xm + offs_k
    up_ptrs = (w_ptr + (rows + N)[:, None, None].to(tl.int64) * stride_wn
               + offs_k[None, :, :])                       # (GATED only)
    # Tile 0 is peeled off the loop: its weights before the wait, everything else after it.
    w = load_k_tile(w_ptrs, 0, offs_k, K, BLOCK_K)
    if GATED:
        u = load_k_tile(up_ptrs, 0, offs_k, K, BLOCK_K)
    pdl_wait(PDL)
    acc = _accumulate(tl.zeros((BLOCK_N, CHUNKS, CHUNK), dtype=tl.float32), w, x_ptrs, s_ptr,
                      rows, first_row, stride_sn, 0, offs_k, offs_c, K, SCALE_BN, SCALE_BK,
                      BLOCK_SCALES, BLOCK_N, BLOCK_K, CHUNK)
    if GATED:
        acc_up = _accumulate(tl.zeros((BLOCK_N, CHUNKS, CHUNK), dtype=tl.float32), u, x_ptrs,
                             s_ptr, rows + N, first_row + N, stride_sn, 0, offs_k, offs_c, K,
                             SCALE_BN, SCALE_BK, BLOCK_SCALES, BLOCK_N, BLOCK_K, CHUNK)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        acc = _accumulate(acc, load_k_tile(w_ptrs, k0, offs_k, K, BLOCK_K), x_ptrs, s_ptr, rows,
                          first_row, stride_sn, k0, offs_k, offs_c, K, SCALE_BN, SCALE_BK,
                          BLOCK_SCALES, BLOCK_N, BLOCK_K, CHUNK)
        if GATED:
            up_ptrs += BLOCK_K
            acc_up = _accumulate(acc_up, load_k_tile(up_ptrs, k0, offs_k, K, BLOCK_K), x_ptrs,
                                 s_ptr, rows + N, first_row + N, stride_sn, k0, offs_k, offs_c,
                                 K, SCALE_BN, SCALE_BK, BLOCK_SCALES, BLOCK_N, BLOCK_K, CHUNK)
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    if not BLOCK_SCALES:
        y *= tl.load(s_ptr + rows)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows).to(tl.float32)
    if GATED:
        y_up = tl.sum(tl.sum(acc_up, axis=2), axis=1)
        if not BLOCK_SCALES:
            y_up *= tl.load(s_ptr + rows + N)
        y = silu_mul_rounded(y, y_up, y_ptr.dtype.element_ty)
    tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def fp8_gemv_tiles(n: int, k: int, block: tuple[int, int] | None) -> Fp8GemvTiles:
    """Default tiles (`bench quant --parts gemv-sweep` on an H200, Llama-3.1-8B shapes): four
    rows a program, 4,096 bytes of each row a load (2,048 where K is not a multiple of 4,096:
    fewer masked loads); block scales: 1,024 bytes of each row a load, in chunks of one scale
    block, eight rows a program up to N = 4,096, else four."""
    if block:
        chunk = min(128, block[1])
        return Fp8GemvTiles(block_n=8 if n <= 4096 else 4, chunk=chunk,
                            chunks=max(1, 1024 // chunk))
    return Fp8GemvTiles(block_n=4, chunk=4096 if k % 4096 == 0 else 2048, chunks=1)


def gated_tiles(n: int, k: int, block: tuple[int, int] | None) -> Fp8GemvTiles | None:
    """Tiles of the gated product ([gate | up], N rows each): half the plain product's rows a
    program, as each reads as many up rows as gate rows. None for block scales where N is
    not a multiple of the tile's rows: a program's up rows could then straddle two blocks of
    scale rows, which the kernel's one-scale-row-per-tile path assumes they do not (loaded
    checkpoints never do this: their gate part ends on a block boundary)."""
    t = fp8_gemv_tiles(n, k, block)
    t = Fp8GemvTiles(max(2, t.block_n // 2), t.chunk, t.chunks, t.num_warps)
    return None if block is not None and n % t.block_n else t


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
             block: tuple[int, int] | None, bias: torch.Tensor | None = None,
             tiles: Fp8GemvTiles | None = None, gated: bool = False) -> torch.Tensor:
    """x [M, K] (a few rows; one program row each) times the FP8 weight w [N, K] with `scale`
    ([N], or [ceil(N/bn), ceil(K/bk)] for `block` (bn, bk)), plus bias: [M, N] in x's dtype.
    `gated`: w is [gate | up] and the result silu(gate) * up, [M, N / 2] (no bias; see
    `gated_tiles` for the shapes it takes)."""
    m, k = x.shape
    n = w.shape[0] // 2 if gated else w.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles or (gated_tiles(n, k, block) if gated else fp8_gemv_tiles(n, k, block))
    if gated and (bias is not None or w.shape[0] % 2 or tiles is None
                  or (block is not None and n % tiles.block_n)):
        raise ValueError("a gated fp8_gemv takes an even number of weight rows, no bias, and "
                         "with block scales N / 2 rows a multiple of the tile's rows")
    if block is not None and block[1] % tiles.chunk:
        raise ValueError(f"chunk {tiles.chunk} must divide the scale block {block[1]}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(m, triton.cdiv(n, tiles.block_n))](
        x, w, scale, bias if bias is not None else scale, y, n, x.stride(0), w.stride(0),
        y.stride(0), scale.stride(0) if block else 0, K=k,
        SCALE_BN=block[0] if block else 1, SCALE_BK=block[1] if block else 1,
        BLOCK_SCALES=block is not None, HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n,
        CHUNKS=tiles.chunks, CHUNK=tiles.chunk, GATED=gated, num_warps=tiles.num_warps,
        num_stages=1, **pdl_kwargs(x.device, m))
    return y
