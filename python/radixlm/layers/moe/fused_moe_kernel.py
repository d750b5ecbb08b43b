"""The fused MoE kernels: token-expert pairs grouped by expert, one Triton grouped GEMM per
matrix.

A batch of T tokens each routed to k experts is T*k (token, expert) pairs. They are sorted by
expert and each expert's run is padded to a multiple of BLOCK_M (`align_pairs_to_blocks`), so
every BLOCK_M-row block of the sorted list belongs to exactly one expert. The GEMM kernel then
runs one program per (block, N tile): it gathers its rows of the input by pair id, multiplies
by that expert's weight tile and scatters the result back to the pairs' rows. Padding rows
carry an id past the last pair and are masked out.

    gate_up:  [T*k, 2I] = x[pair // k] @ w13[e]^T
    act:      [T*k, I]  = silu(gate) * up
    down:     [T*k, H]  = act[pair] @ w2[e]^T * weight[pair]      (routing weight folded in)
    out:      [T, H]    = sum over the k pairs of each token

Every shape here depends on T, k and the number of experts only (the padded length is its
upper bound, T*k + E*(BLOCK_M-1); blocks past the real end exit at once), so the whole path
needs no host sync and is captured by CUDA graphs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait


@dataclass(frozen=True)
class MoETileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def default_tile_config(num_pairs: int, num_experts: int, n: int, k: int,
                        dtype: torch.dtype) -> MoETileConfig:
    """Tiles by the expected rows per expert: small batches are weight-bandwidth bound (few
    rows, wide N tiles, deep K), big ones compute bound (square tiles, pipelined)."""
    rows_per_expert = num_pairs / max(num_experts, 1)
    if rows_per_expert <= 1:
        return MoETileConfig(16, 32, 128 if dtype.itemsize <= 2 else 64, 1, 4, 4)
    if rows_per_expert <= 16:
        return MoETileConfig(16, 64, 128 if dtype.itemsize <= 2 else 64, 1, 4, 4)
    if rows_per_expert <= 64:
        return MoETileConfig(32, 64, 64, 8, 4, 4)
    return MoETileConfig(64, 128, 64, 8, 8 if n >= 4096 else 4, 3)


@dataclass
class AlignedPairs:
    """Token-expert pairs sorted by expert, each expert's run padded to whole blocks."""

    sorted_pair_ids: torch.Tensor   # [max_padded] int32; id >= num_pairs marks padding
    block_expert: torch.Tensor      # [max_blocks] int32: the expert of each block
    num_padded: torch.Tensor        # [1] int32: the real padded length (blocks past it exit)
    num_pairs: int
    block_m: int


# Up to this many pairs (decode batches) one Triton kernel does the alignment; its pairwise
# ranking is quadratic (on an H200 ~65 us at 4096 pairs and 128 experts, ~190 us with 256),
# so bigger batches use the torch ops below.
SMALL_ALIGN_MAX_PAIRS = 2048


@triton.jit
def _align_small_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, num_pairs,
                        num_experts, max_blocks,
                        BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr,
                        CHUNK: tl.constexpr, BLOCK_B: tl.constexpr):
    """Each program places CHUNK pairs: a pair's slot is its expert's padded start plus the
    number of earlier pairs routed to the same expert (a stable counting sort). Program 0
    also writes each block's expert and the padded length."""
    pid = tl.program_id(0)
    offs_p = tl.arange(0, BLOCK_P)
    all_ids = tl.load(ids_ptr + offs_p, mask=offs_p < num_pairs, other=BLOCK_E - 1)
    # Padding pairs land in the last bin (BLOCK_E - 1 >= num_experts), which is never used.
    counts = tl.histogram(all_ids, BLOCK_E)
    offs_e = tl.arange(0, BLOCK_E)
    counts = tl.where(offs_e < num_experts, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    padded_start = padded_end - padded

    offs_i = pid * CHUNK + tl.arange(0, CHUNK)
    i_ok = offs_i < num_pairs
    my_ids = tl.load(ids_ptr + offs_i, mask=i_ok, other=0)
    earlier = (all_ids[None, :] == my_ids[:, None]) & (offs_p[None, :] < offs_i[:, None])
    rank = tl.sum(earlier.to(tl.int32), 1)
    start = tl.sum(tl.where(offs_e[None, :] == my_ids[:, None], padded_start[None, :], 0), 1)
    tl.store(sorted_ptr + start + rank, offs_i, mask=i_ok)

    if pid == 0:
        offs_b = tl.arange(0, BLOCK_B)
        # Block b belongs to the first expert whose padded run ends after b * BLOCK_M.
        ends_before = (padded_end[None, :] <= (offs_b * BLOCK_M)[:, None]) & (
            offs_e[None, :] < num_experts)
        expert = tl.minimum(tl.sum(ends_before.to(tl.int32), 1), num_experts - 1)
        tl.store(block_expert_ptr + offs_b, expert, mask=offs_b < max_blocks)
        tl.store(num_padded_ptr, tl.max(padded_end, 0))


def align_pairs_to_blocks(topk_ids: torch.Tensor, num_experts: int,
                          block_m: int) -> AlignedPairs:
    """topk_ids [T, k] -> pairs grouped by expert in BLOCK_M-aligned runs, with ops whose
    shapes depend on T, k, E only (no host sync, graph capturable)."""
    num_pairs = topk_ids.numel()
    on_triton = topk_ids.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if on_triton and 0 < num_pairs <= SMALL_ALIGN_MAX_PAIRS and topk_ids.is_contiguous():
        return _align_small(topk_ids, num_experts, block_m)
    return _align_torch(topk_ids, num_experts, block_m)


def _max_padded(num_pairs: int, num_experts: int, block_m: int) -> int:
    n = num_pairs + num_experts * (block_m - 1)
    return (n + block_m - 1) // block_m * block_m


def _align_small(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """The single-kernel alignment (two launches with the padding fill)."""
    num_pairs = topk_ids.numel()
    device = topk_ids.device
    max_padded = _max_padded(num_pairs, num_experts, block_m)
    max_blocks = max_padded // block_m
    sorted_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    chunk = 64
    _align_small_kernel[(triton.cdiv(num_pairs, chunk),)](
        topk_ids, sorted_ids, block_expert, num_padded, num_pairs, num_experts, max_blocks,
        BLOCK_M=block_m, BLOCK_E=triton.next_power_of_2(num_experts + 1),
        BLOCK_P=triton.next_power_of_2(num_pairs), CHUNK=chunk,
        BLOCK_B=triton.next_power_of_2(max_blocks), num_warps=4)
    return AlignedPairs(sorted_ids, block_expert, num_padded, num_pairs, block_m)


def _align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    run_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    expert_of_sorted = flat[order]
    rank_in_expert = torch.arange(num_pairs, device=device) - run_start[expert_of_sorted]
    max_padded = _max_padded(num_pairs, num_experts, block_m)
    sorted_ids = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids[padded_start[expert_of_sorted] + rank_in_expert] = order.to(torch.int32)
    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = block_expert.clamp_(max=num_experts - 1).to(torch.int32)
    return AlignedPairs(sorted_ids, block_expert, padded_end[-1:].to(torch.int32), num_pairs,
                        block_m)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weight_ptr, s_ptr, as_ptr,
    sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs, a_rows_per_pair,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_se, stride_sn, stride_asm,
    MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PREC: tl.constexpr,
    B_SCALES: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
    A_GROUP: tl.constexpr,
):
    """C[pair] = A[pair // a_rows_per_pair] @ B[expert]^T (* weight[pair]).

    B_SCALES: 0, B is in A's dtype; 1, B is FP8 with one scale per (expert, output row),
    applied once at the end; 2, B is FP8 with one scale per (expert, SCALE_BN x SCALE_BK
    block), applied to each K tile's partial product (BLOCK_K divides SCALE_BK). FP8 tiles are
    widened to A's dtype in registers, so the weight bytes are read once, at one byte each.

    A_GROUP > 0: A is FP8 too, with one scale per (row, A_GROUP inputs) at as_ptr, and the
    tiles multiply as FP8 on the tensor cores (W8A8, for batches big enough to be compute
    bound); BLOCK_K divides A_GROUP."""
    pid = tl.program_id(0)
    num_blocks_m = tl.cdiv(tl.load(num_padded_ptr), BLOCK_M)
    num_blocks_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_M row blocks share each B tile while it is in L2.
    per_group = GROUP_M * num_blocks_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(tl.num_programs(0) // num_blocks_n - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    if pid_m >= num_blocks_m:
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    a_row = pair // a_rows_per_pair
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)

    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + offs_n[:, None] * stride_bn
              + offs_k[None, :] * stride_bk)
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s_ptrs = s_ptr + expert * stride_se + (offs_n // SCALE_BN) * stride_sn
    as_ptrs = as_ptr + a_row.to(tl.int64) * stride_asm
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if A_GROUP > 0:
            part = tl.dot(a, tl.trans(b))
            part = part * tl.load(as_ptrs + k0 // A_GROUP, mask=row_ok, other=0.0)[:, None]
        else:
            if B_SCALES != 0:
                b = b.to(a.dtype)
            part = tl.dot(a, tl.trans(b), input_precision=DOT_PREC)
        if B_SCALES == 2:
            acc += part * tl.load(s_ptrs + k0 // SCALE_BK, mask=n_ok, other=0.0)[None, :]
        else:
            acc += part
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if B_SCALES == 1:
        acc = acc * tl.load(s_ptrs, mask=n_ok, other=0.0)[None, :]
    if MUL_WEIGHT:
        w = tl.load(weight_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + pair[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, pairs: AlignedPairs,
                 a_rows_per_pair: int, tile: MoETileConfig,
                 pair_weights: torch.Tensor | None = None,
                 b_scale: torch.Tensor | None = None,
                 scale_block: tuple[int, int] | None = None,
                 a_scale: torch.Tensor | None = None, a_group: int = 0) -> torch.Tensor:
    """out[pair] = a[pair // a_rows_per_pair] @ b[expert(pair)]^T, times pair_weights[pair]
    when given. a [rows, K], b [E, N, K], out [num_pairs, N].

    `b_scale`: b is FP8 and stands for b * scale, with scale [E, N] (one per output row) or,
    given `scale_block` (bn, bk), [E, ceil(N/bn), ceil(K/bk)] (one per block). `a_scale`: a
    is FP8 as well, standing for a * a_scale, [rows, ceil(K/a_group)]."""
    n, k = b.shape[1], b.shape[2]
    max_blocks = pairs.sorted_pair_ids.numel() // tile.block_m
    grid = (max_blocks * triton.cdiv(n, tile.block_n),)
    weights = pair_weights if pair_weights is not None else out   # unused when not multiplying
    mode, scale_bn, scale_bk, block_k = 0, 1, 1, tile.block_k
    if b_scale is not None:
        mode = 1 if scale_block is None else 2
        scale_bn, scale_bk = scale_block or (1, 1)
        if scale_block is not None:       # a K tile must not straddle two scale blocks
            block_k = min(block_k, scale_bk)
            if scale_bk % block_k:
                raise ValueError(f"K tile {block_k} does not divide the scale block {scale_bk}")
    if a_scale is not None:
        block_k = min(block_k, a_group)
    scales = b_scale if b_scale is not None else out              # unused without scales
    _grouped_gemm_kernel[grid](
        a, b, out, weights, scales, a_scale if a_scale is not None else out,
        pairs.sorted_pair_ids, pairs.block_expert,
        pairs.num_padded, n, k, pairs.num_pairs, a_rows_per_pair,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1),
        scales.stride(0) if b_scale is not None else 0,
        scales.stride(1) if b_scale is not None else 0,
        a_scale.stride(0) if a_scale is not None else 0,
        MUL_WEIGHT=pair_weights is not None, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=block_k, GROUP_M=tile.group_m,
        DOT_PREC="ieee" if a.dtype == torch.float32 else "tf32",
        B_SCALES=mode, SCALE_BN=scale_bn, SCALE_BK=scale_bk,
        A_GROUP=a_group if a_scale is not None else 0, num_warps=tile.num_warps,
        num_stages=tile.num_stages)
    return out


@triton.jit
def _sum_pairs_kernel(pairs_ptr, add_ptr, out_ptr, hidden, stride_p, stride_a, stride_o,
                      TOP_K: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = (t * TOP_K + j).to(tl.int64)
        acc += tl.load(pairs_ptr + row * stride_p + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_ADD:
        acc += tl.load(add_ptr + t.to(tl.int64) * stride_a + offs, mask=ok,
                       other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + offs, acc.to(out_ptr.dtype.element_ty),
             mask=ok)


def sum_pairs(pairs: torch.Tensor, top_k: int, add: torch.Tensor | None = None) -> torch.Tensor:
    """pairs [T*k, H] (each token's k weighted expert outputs, in token order) -> [T, H], their
    sum (plus `add`, e.g. the shared experts' output), accumulated in fp32."""
    t = pairs.shape[0] // top_k
    hidden = pairs.shape[1]
    out = torch.empty((t, hidden), dtype=pairs.dtype, device=pairs.device)
    if t == 0:
        return out
    block = min(1024, triton.next_power_of_2(hidden))
    _sum_pairs_kernel[(t, triton.cdiv(hidden, block))](
        pairs, add if add is not None else out, out, hidden, pairs.stride(0),
        add.stride(0) if add is not None else 0, out.stride(0),
        TOP_K=top_k, HAS_ADD=add is not None, BLOCK=block, num_warps=4,
        **pdl_kwargs(pairs.device, t))
    return out
