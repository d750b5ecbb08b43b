"""The routed experts of a decode step with a handful of tokens: one GEMV per (token, expert)
pair, on the CUDA cores, with no sorting by expert.

With one or a few tokens, each expert a token picks gets one row. The grouped GEMM
(fused_moe_kernel.py) pads that row to a 16-row tensor-core block and first sorts the pairs by
expert (two more launches); here each program instead takes one pair and a BLOCK_N-row strip of
that pair's expert weight, reads the strip once with wide K-contiguous loads, widens it (FP8 or
bf16) to fp32, multiplies by the pair's activation row and reduces along K (16-bit and FP8: into a
float32 accumulator as wide as the tile, summed once after the loop, as the one-row GEMV does).
The down projection reads its input as [gate | up] and applies SiLU-and-mul on the fly, so no
activation tensor is written between the two GEMVs.

    gate_up[pair] = x[pair // k] @ w13[e]^T                       [P, 2I]
    down[pair]    = (silu(gate) * up)[pair] @ w2[e]^T * weight     [P, H]

Expert weights must be K-contiguous ([E, N, K] with stride 1 along K), as they are stacked.
A pair whose expert was also picked by another token of the step reads its strip again (from
L2 if it fits), which is why the MoE layer uses this only for a few tokens
(`use_pair_gemv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.layers.kernels.gemv_kernels import load_k_tile
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# Up to this many tokens a step's experts may run as per-pair GEMVs (bench moe --parts kernel,
# both paths forced, H200: at 4 tokens still ahead on Qwen3-30B-A3B, even on DeepSeek-V2-Lite;
# at 16 behind on every shape).
PAIR_GEMV_MAX_TOKENS = 4
# A bf16 down projection longer than this runs too few programs, each a long serial reduction
# (Mixtral's 14336: 0.221 vs 0.197 ms at batch 1); FP8 reads half the bytes and stays ahead.
PAIR_GEMV_MAX_BF16_K = 4096


def use_pair_gemv(num_tokens: int, num_pairs: int, num_experts: int, down_k: int,
                  fp8: bool) -> bool:
    """Few tokens, and few enough pairs that most pick an expert nobody else in the step did."""
    if num_tokens > PAIR_GEMV_MAX_TOKENS or 2 * num_pairs > max(num_experts, 4):
        return False
    return fp8 or down_k <= PAIR_GEMV_MAX_BF16_K


@dataclass(frozen=True)
class PairGemvTiles:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    # A float32 accumulator as wide as the tile, summed once after the loop (the one-row
    # GEMV's layout, gemv_kernels.py), with a compile-time K and unpredicated weight loads;
    # False: one row sum per K tile. Block-scaled (FP8) experts take it only where a strip
    # lies inside one block of rows (the block's row count a multiple of block_n).
    wide: bool = False


def pair_gemv_tiles(k: int, weight_bytes: int, gated: bool) -> PairGemvTiles:
    """16-bit and FP8 experts take the wide accumulator; float32 experts keep the earlier
    kernel (16-row strips, K tiles of 1,024).

    16-bit: 2 rows a program for gate_up and 8 for the down projection, K tiles of 1,024,
    8 warps where the down projection's K exceeds one tile (`results/issue16/pair_gemv_wide/`,
    H200, batch 1, each GEMM over 16 expert sets in a graph: Qwen3-30B-A3B gate_up 17.6 ->
    12.9 us, down 11.0 -> 8.8; DeepSeek-V2-Lite 18.9 -> 17.1 and 17.1 -> 12.5).

    FP8 (`results/issue16/fp8_pair_gemv_wide/`, same timing, row and 128 x 128 block scales):
    gate_up 4 rows x 2,048 where K fits one tile, else 16 x 512 (Qwen3-30B-A3B 16.6 / 11.1 ->
    9.2 / 8.8 us, DeepSeek-V2-Lite 18.0 / 11.7 -> 11.5 / 11.2, Mixtral 94.1 / 70.0 -> 64.3 /
    63.0); down 16 rows x 1,024 (K <= 1,024) or 512 (Qwen3-30B-A3B 7.4 / 7.5 -> 7.9 / 6.2,
    DeepSeek-V2-Lite 9.1 / 9.2 -> 9.6 / 8.7, Mixtral 60.5 / 62.1 -> 42.9 / 35.4)."""
    fit = triton.next_power_of_2(k)     # no K tile wider than K needs (small test models)
    if weight_bytes == 2:
        if not gated:
            return PairGemvTiles(2, min(1024, fit), 4, 1, wide=True)
        return PairGemvTiles(8, min(1024, fit), 8 if k > 1024 else 4, 1, wide=True)
    if weight_bytes == 1:
        if gated:
            return PairGemvTiles(16, min(1024, fit) if k <= 1024 else 512, 4, 1, wide=True)
        return PairGemvTiles(4, min(2048, fit), 4, 1, wide=True) if k <= 2048 else \
            PairGemvTiles(16, 512, 4, 1, wide=True)
    return PairGemvTiles(16, max(min(fit, 1024), 16))


@triton.jit
def _pair_gemv_kernel(a_ptr, b_ptr, c_ptr, weight_ptr, s_ptr, ids_ptr,
                      N, K, a_rows_per_pair, stride_am, stride_be, stride_bn, stride_cm,
                      stride_se, stride_sn,
                      MUL_WEIGHT: tl.constexpr, GATED: tl.constexpr, B_SCALES: tl.constexpr,
                      SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """c[pair, n-strip] = a_row(pair) . b[expert(pair), n-strip, :] (* weight[pair]).

    B_SCALES as in the grouped GEMM: 0 none, 1 one scale per (expert, row), 2 one per
    (expert, SCALE_BN x SCALE_BK block); a K tile spanning several blocks reduces per block
    first. GATED: a's row is [gate (K) | up (K)] and the input is silu(gate) * up, rounded to
    a's dtype once (the separate activation kernel also rounds silu(gate) first: the two may
    differ by an ulp).

    With PDL (utils/pdl.py) the wait comes first: which weights to read depends on
    the expert ids the routing kernel just wrote."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    pair = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    a_row = a_ptr + (pair // a_rows_per_pair).to(tl.int64) * stride_am
    b_rows = b_ptr + expert * stride_be + offs_n[:, None].to(tl.int64) * stride_bn
    s_rows = s_ptr + expert * stride_se + (offs_n // SCALE_BN) * stride_sn
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        if GATED:
            gate = tl.load(a_row + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            up = tl.load(a_row + K + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            x = (gate / (1.0 + tl.exp(-gate)) * up).to(a_ptr.dtype.element_ty).to(tl.float32)
        else:
            x = tl.load(a_row + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(b_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        prod = w.to(tl.float32) * x[None, :]
        if B_SCALES == 2:
            if BLOCK_K > SCALE_BK:
                per_block = tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // SCALE_BK, SCALE_BK)),
                                   axis=2)
                offs_kb = k0 // SCALE_BK + tl.arange(0, BLOCK_K // SCALE_BK)
                kb_ok = offs_kb < tl.cdiv(K, SCALE_BK)
                s = tl.load(s_rows[:, None] + offs_kb[None, :],
                            mask=n_ok[:, None] & kb_ok[None, :], other=0.0)
                acc += tl.sum(per_block * s, axis=1)
            else:
                acc += tl.sum(prod, axis=1) * tl.load(s_rows + k0 // SCALE_BK, mask=n_ok,
                                                      other=0.0)
        else:
            acc += tl.sum(prod, axis=1)
    if B_SCALES == 1:
        acc = acc * tl.load(s_rows, mask=n_ok, other=0.0)
    if MUL_WEIGHT:
        acc = acc * tl.load(weight_ptr + pair)
    tl.store(c_ptr + pair.to(tl.int64) * stride_cm + offs_n,
             acc.to(c_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _pair_gemv_wide_kernel(a_ptr, b_ptr, c_ptr, weight_ptr, s_ptr, ids_ptr,
                           N, a_rows_per_pair, stride_am, stride_be, stride_bn, stride_cm,
                           stride_se, stride_sn,
                           K: tl.constexpr, MUL_WEIGHT: tl.constexpr, GATED: tl.constexpr,
                           B_SCALES: tl.constexpr, SCALE_BK: tl.constexpr,
                           SCALE_ROW_BLOCK: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PDL: tl.constexpr = False):
    """_pair_gemv_kernel's product with the wide accumulator (PairGemvTiles.wide): rows past
    N read row N - 1 again (never stored), so the weight loads are masked only where K is not
    a multiple of BLOCK_K.

    Scales cost nothing per weight: a strip of BLOCK_N rows lies inside one scale block of
    rows (SCALE_ROW_BLOCK, a multiple of BLOCK_N), so under block scales (B_SCALES 2) every
    row of it shares one scale per SCALE_BK inputs, and that scale multiplies x instead of
    the weights (sum_k w[n, k] s[k // SCALE_BK] x[k]). Row scales (B_SCALES 1) multiply the
    row sums once."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    pair = tl.program_id(0)
    strip = tl.program_id(1) * BLOCK_N
    offs_n = strip + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rows = tl.minimum(offs_n, N - 1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    a_row = a_ptr + (pair // a_rows_per_pair).to(tl.int64) * stride_am
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + expert * stride_be + rows[:, None].to(tl.int64) * stride_bn + offs_k[None, :]
    s_strip = s_ptr + expert * stride_se + (strip // SCALE_ROW_BLOCK) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if GATED:
            gate = load_k_tile(a_row + k0 + offs_k, k0, offs_k, K, BLOCK_K).to(tl.float32)
            up = load_k_tile(a_row + K + k0 + offs_k, k0, offs_k, K, BLOCK_K).to(tl.float32)
            x = (gate / (1.0 + tl.exp(-gate)) * up).to(a_ptr.dtype.element_ty).to(tl.float32)
        else:
            x = load_k_tile(a_row + k0 + offs_k, k0, offs_k, K, BLOCK_K).to(tl.float32)
        if B_SCALES == 2:    # x's columns past K are 0: their (clamped) scale does not matter
            kb = tl.minimum((k0 + offs_k) // SCALE_BK, (K - 1) // SCALE_BK)
            x = x * tl.load(s_strip + kb)
        w = load_k_tile(b_ptrs + k0, k0, offs_k[None, :], K, BLOCK_K)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if B_SCALES == 1:
        y = y * tl.load(s_ptr + expert * stride_se + rows * stride_sn)
    if MUL_WEIGHT:
        y = y * tl.load(weight_ptr + pair)
    tl.store(c_ptr + pair.to(tl.int64) * stride_cm + offs_n, y.to(c_ptr.dtype.element_ty),
             mask=n_ok)


def pair_gemv(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, expert_ids: torch.Tensor,
              a_rows_per_pair: int, gated: bool = False,
              pair_weights: torch.Tensor | None = None, b_scale: torch.Tensor | None = None,
              scale_block: tuple[int, int] | None = None,
              tiles: PairGemvTiles | None = None, num_tokens: int | None = None
              ) -> torch.Tensor:
    """out[p] = in(p) @ b[expert_ids[p]]^T (* pair_weights[p]), in(p) = a[p // a_rows_per_pair]
    or, `gated`, silu(gate) * up of a[p] = [gate | up]. b [E, N, K] K-contiguous; `b_scale` /
    `scale_block`: FP8 b, as in fused_moe_kernel.grouped_gemm. `num_tokens`: the step's
    tokens, which decide whether the kernel launches with PDL (default: a's rows)."""
    n, k = b.shape[1], b.shape[2]
    if b.stride(2) != 1:
        raise ValueError("pair_gemv needs K-contiguous expert weights")
    tiles = tiles or pair_gemv_tiles(k, b.element_size(), gated)
    mode, scale_bn, scale_bk = 0, 1, 1
    if b_scale is not None:
        mode = 1 if scale_block is None else 2
        scale_bn, scale_bk = scale_block or (1, 1)
    scales = b_scale if b_scale is not None else out
    weights = pair_weights if pair_weights is not None else out
    grid = (expert_ids.numel(), triton.cdiv(n, tiles.block_n))
    pdl = pdl_kwargs(a.device, a.shape[0] if num_tokens is None else num_tokens)
    if tiles.wide and (mode != 2 or scale_bn % tiles.block_n == 0):
        _pair_gemv_wide_kernel[grid](
            a, b, out, weights, scales, expert_ids, n, a_rows_per_pair, a.stride(0),
            b.stride(0), b.stride(1), out.stride(0),
            scales.stride(0) if b_scale is not None else 0,
            scales.stride(1) if b_scale is not None else 0,
            K=k, MUL_WEIGHT=pair_weights is not None, GATED=gated, B_SCALES=mode,
            SCALE_BK=scale_bk, SCALE_ROW_BLOCK=scale_bn if mode == 2 else 1,   # (2 only)
            BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, **pdl)
        return out
    # The earlier kernel reduces a K tile per scale block: one must divide the other.
    if mode == 2 and scale_bk % tiles.block_k and tiles.block_k % scale_bk:
        raise ValueError(f"K tile {tiles.block_k} and scale block {scale_bk}: neither "
                         f"divides the other")
    _pair_gemv_kernel[grid](
        a, b, out, weights, scales, expert_ids, n, k, a_rows_per_pair, a.stride(0),
        b.stride(0), b.stride(1), out.stride(0),
        scales.stride(0) if b_scale is not None else 0,
        scales.stride(1) if b_scale is not None else 0,
        MUL_WEIGHT=pair_weights is not None, GATED=gated, B_SCALES=mode, SCALE_BN=scale_bn,
        SCALE_BK=scale_bk, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl)
    return out
