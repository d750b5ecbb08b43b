"""One row of x times a 4-bit weight: the decode step's linear layers at batch 1.

The weight is int4_kernels.py's packed layout: qweight [K/8, N] int32 (input 8r + j in bits
4j..4j+3 of word (r, n)), scales [G, N] fp32, zeros [G, N] uint8, one per `group` inputs.

A 4-bit weight is a quarter of the bf16 bytes, so what bounds this kernel is the instructions
each packed word costs, then how many bytes are in flight, not the bandwidth alone. Hence:
- **Wide column blocks, K split.** A program takes one group of K (GROUP/8 word rows) for
  512-1,024 columns: every load is num_warps whole rows of 2-4 KiB. The SPLIT programs of a
  column block meet in the layer's split-K scratch; the last of them writes the output
  (split_k.py: no extra launch). (One program per column
  block, as the bf16 and FP8 kernels do, either read 32-64 bytes of a row at a time or left
  most SMs idle: 2x slower than int4_kernels.py's small-M kernel.)
- **Three instructions a weight.** A nibble becomes a float by an AND and an OR into a float
  whose exponent makes the nibble's lowest bit worth 1, minus that float's leading 1 (exact);
  a fused multiply-add takes it into the dot product. Nibbles 5-7 are read the same way from
  the word shifted right by 12. The zero point is not subtracted per weight: per group,
  sum (q - z) s x = s sum q x - z s sum x. The masks arrive as a run-time argument, so they stay
  in registers (as constants the compiler moved one into a register before every use).

One loop iteration of 512 columns x 4 rows costs ~35 instructions a word on Hopper (the
earlier kernel: ~49), and the Llama-3.1-8B layers read 29-64% of the copy bandwidth, 1.3-1.5x
faster than that kernel (`bench quant --parts gemv-sweep`, H200).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.layers.quantization.int4_kernels import PACK
from radixlm.layers.quantization.split_k import SplitKScratch, split_k_total


@dataclass(frozen=True)
class W4GemvTiles:
    block_n: int        # output columns per program
    split: int          # programs sharing a column block, each a slice of K's groups
    num_warps: int = 4


@triton.jit
def _nibble(src, mask, SHIFT: tl.constexpr):
    """The nibble of `src` at bit SHIFT (<= 16; `mask` = 0xF << SHIFT) as a float, exactly:
    OR-ed into a float whose exponent makes the nibble's lowest bit worth 1, minus that
    float's leading 1."""
    MAGIC: tl.constexpr = (127 + 23 - SHIFT) << 23
    BASE: tl.constexpr = float(2 ** (23 - SHIFT))
    return ((src & mask) | MAGIC).to(tl.float32, bitcast=True) - BASE


@triton.jit
def _nibble_j(words, high, nibble, J: tl.constexpr):
    """Nibble J of the words as a float: 0..4 in place, 5..7 from `high` (the words shifted
    right by 12). The mask is built from the run-time `nibble` (see the kernel)."""
    if J < 5:
        f = _nibble(words, nibble << (4 * J), 4 * J)
    else:
        f = _nibble(high, nibble << (4 * (J - 3)), 4 * (J - 3))
    return f


@triton.jit
def _w4_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, b_ptr, y_ptr, part_ptr, count_ptr, N, nibble,
                    K: tl.constexpr, GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr,
                    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Column block program_id(0), groups [program_id(1) * GROUPS_PER_PROGRAM, ...) of K.
    `nibble` is 0xF, passed at run time so that the five masks stay in registers (as
    constants the compiler re-creates them before every use)."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    R: tl.constexpr = GROUP // 8                    # word rows per group
    NUM_GROUPS: tl.constexpr = (K + GROUP - 1) // GROUP
    EXACT: tl.constexpr = EVEN_N and K % GROUP == 0
    r = tl.arange(0, ROWS)
    g_begin = tl.program_id(1) * GROUPS_PER_PROGRAM
    g_end = tl.minimum(g_begin + GROUPS_PER_PROGRAM, NUM_GROUPS)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for g in range(g_begin, g_end):
        if EXACT:
            s = tl.load(s_ptr + g * N + offs_n)
            z = tl.load(z_ptr + g * N + offs_n)
        else:
            s = tl.load(s_ptr + g * N + offs_n, mask=n_mask, other=0.0)
            z = tl.load(z_ptr + g * N + offs_n, mask=n_mask, other=0)
        # dot: sum over the group's word rows (ROWS at a time) and nibbles of q * x.
        dot = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        x_sum = tl.zeros((ROWS,), dtype=tl.float32)
        for sub in tl.static_range(R // ROWS):
            rows = g * R + sub * ROWS + r
            w_ptrs = qw_ptr + rows[:, None].to(tl.int64) * N + offs_n[None, :]
            if EXACT:
                words = tl.load(w_ptrs)
            else:
                words = tl.load(w_ptrs, mask=(rows < K // 8)[:, None] & n_mask[None, :],
                                other=0)
            high = words >> 12                      # nibbles 5..7 into bits 8..19
            for j in tl.static_range(8):
                if EXACT:
                    x = tl.load(x_ptr + rows * 8 + j).to(tl.float32)
                else:
                    x = tl.load(x_ptr + rows * 8 + j, mask=rows * 8 + j < K,
                                other=0.0).to(tl.float32)
                x_sum += x
                dot += _nibble_j(words, high, nibble, j) * x[:, None]
        # s (sum q x - z sum x), row by row of the tile: no reduction inside the loop.
        acc += dot * s[None, :] - x_sum[:, None] * (z.to(tl.float32) * s)[None, :]
    last, total = split_k_total(part_ptr + offs_n, count_ptr + pid_n, tl.sum(acc, axis=0),
                                n_mask, SPLIT)
    if last:
        if HAS_BIAS:
            total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs_n, total.to(y_ptr.dtype.element_ty), mask=n_mask)


def w4_gemv_supports(group: int) -> bool:
    """Whether the kernel takes this group size: a power-of-two number of word rows, at most
    256 inputs (a load is one group)."""
    rows = group // PACK
    return group % PACK == 0 and 0 < rows <= 32 and rows & (rows - 1) == 0


def w4_gemv_tiles(n: int, k: int, group: int) -> W4GemvTiles:
    """Default tiles (`bench quant --parts gemv-sweep`, H200, Llama-3.1-8B shapes): one group
    of K a program (the sweep's fastest split on every shape), 1,024 columns for the wide and
    the long layers (gate_up, down), 512 for the others."""
    block_n = 1024 if n >= 16384 or k >= 8192 else 512
    return W4GemvTiles(block_n, split=-(-k // group))


def w4_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
            group: int, scratch: SplitKScratch, bias: torch.Tensor | None = None,
            tiles: W4GemvTiles | None = None) -> torch.Tensor:
    """One row x [1, K] times the packed 4-bit weight (+ bias): [1, N] in x's dtype.
    `scratch`: the layer's split-K buffers (split_k.py; one row of them is used)."""
    m, k = x.shape
    n = qweight.shape[1]
    if m != 1:
        raise ValueError(f"w4_gemv takes one row of x, got {m}")
    if not w4_gemv_supports(group):
        raise ValueError(f"w4_gemv: group size {group} not supported")
    x = x if x.stride(1) == 1 else x.contiguous()
    tiles = tiles or w4_gemv_tiles(n, k, group)
    if not scratch.fits(1, n, tiles.block_n):
        raise ValueError(f"w4_gemv: the scratch does not fit a [1, {n}] output")
    groups = -(-k // group)
    per_program = -(-groups // tiles.split)
    split = -(-groups // per_program)          # no program without groups
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    # Launched without PDL (utils/pdl.py): its grid of column blocks x K splits,
    # launched early, made Llama-3.1-8B's 4-bit batch-1 decode 16% slower (H200).
    _w4_gemv_kernel[(triton.cdiv(n, tiles.block_n), split)](
        x, qweight, scales, zeros, bias if bias is not None else scales, y, scratch.partials,
        scratch.counters, n, 0xF, K=k, GROUP=group, GROUPS_PER_PROGRAM=per_program,
        SPLIT=split, HAS_BIAS=bias is not None, EVEN_N=n % tiles.block_n == 0,
        ROWS=min(tiles.num_warps, group // PACK), BLOCK_N=tiles.block_n,
        num_warps=tiles.num_warps,
        num_stages=1)
    return y
