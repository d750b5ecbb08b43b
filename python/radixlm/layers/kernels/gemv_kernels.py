"""y = x W^T (+ b) for one row of x: the decode step's linear layers at batch 1.

At batch 1 a linear layer only streams its weight; the arithmetic is negligible. cuBLAS's
kernels for the narrower shapes (a tensor-parallel shard's qkv, the o and down projections
onto a 4,096-wide hidden state) reach only 33-77% of the copy bandwidth on an H200, where this
kernel reaches 44-95% (benchmarks/RESULTS.md). Each program takes BLOCK_N weight rows and
walks K in BLOCK_K tiles, every tile one wide, coalesced load (K is contiguous), multiplied by
x on the CUDA cores and summed along K once, after the loop. Accumulation is in float32 with
one output rounding, as cuBLAS.

Taken only where `radixlm bench gemv --sweep` measured it faster than F.linear
(`gemv_tiles`); the LM head and the 70B's wide and long layers, where cuBLAS is at 86-100% of
the copy bandwidth, stay with cuBLAS, as does every product of more
than one row (two or four rows through this kernel were slower than cuBLAS on nearly every
shape). Capturable in CUDA graphs (grid and output from shapes only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait


@dataclass(frozen=True)
class GemvTiles:
    block_n: int          # weight rows per program
    block_k: int          # K elements per load
    num_warps: int = 4
    num_stages: int = 1   # loads outside tl.dot are not pipelined: stages made no difference


@triton.jit
def load_k_tile(ptrs, k0, offs_k, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tile of `ptrs` at K offsets k0 + offs_k (offs_k broadcasts against ptrs' shape),
    masked only where K is not a multiple of BLOCK_K: the loads stay unpredicated otherwise.
    Shared with the FP8 one-row kernel."""
    if K % BLOCK_K == 0:
        t = tl.load(ptrs)
    else:
        t = tl.load(ptrs, mask=k0 + offs_k < K, other=0.0)
    return t


@triton.jit
def silu_mul_rounded(gate, up, dt: tl.constexpr):
    """silu(gate) * up from float32 row sums, rounded as the unfused path rounds it (the GEMV's
    [gate | up] output stored in `dt`, then silu_and_mul, activation_kernels.py). Shared with
    the FP8 one-row kernel."""
    gate = gate.to(dt).to(tl.float32)
    up = up.to(dt).to(tl.float32)
    return tl.math.div_rn(gate, 1.0 + tl.exp(-gate)).to(dt).to(tl.float32) * up


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn, K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GATED: tl.constexpr = False, PDL: tl.constexpr = False):
    """y[n] = sum_k x[k] w[n, k] (+ b[n]) for BLOCK_N consecutive n. K is a compile-time
    constant (a model has two or three): the trip count is known. With PDL the first weight
    tile is requested before waiting for the kernel that writes x (utils/pdl.py).

    GATED: w is [gate | up], 2N rows; the program also takes up's rows n + N and stores
    silu(gate) * up, rounded as `gemv` followed by silu_and_mul (activation_kernels.py) round
    it: the MLP's activation kernel is not launched."""
    pdl_launch_dependents(PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # Rows past N read row N - 1 again instead of a masked load (their sums are never
    # stored): the weight loads, all the bytes that matter, stay unpredicated.
    rows = tl.minimum(offs_n, N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_k
    # Tile 0 is peeled off the loop: its weights are requested before the wait (with PDL),
    # its x, the previous kernel's output, after it.
    up_ptrs = w_ptrs + N * stride_wn     # (GATED only)
    w = load_k_tile(w_ptrs, 0, offs_k, K, BLOCK_K)
    if GATED:
        u = load_k_tile(up_ptrs, 0, offs_k, K, BLOCK_K)
    pdl_wait(PDL)
    x = load_k_tile(x_ptrs, 0, offs_k, K, BLOCK_K).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]
    if GATED:
        acc_up = u.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w = load_k_tile(w_ptrs, k0, offs_k, K, BLOCK_K)
        x = load_k_tile(x_ptrs, k0, offs_k, K, BLOCK_K).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if GATED:
            up_ptrs += BLOCK_K
            acc_up += load_k_tile(up_ptrs, k0, offs_k, K, BLOCK_K).to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if GATED:
        y = silu_mul_rounded(y, tl.sum(acc_up, axis=1), y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


def gemv_tiles(m: int, n: int, k: int) -> GemvTiles | None:
    """The tiles for an [m, k] x [n, k]^T product, or None where F.linear is as fast.

    Fit to `radixlm bench gemv --sweep` on an H200 (benchmarks/results/gemv/): a few hundred
    to a thousand programs, each loading 2-8 rows x 1,024 columns at a time, did best; narrower
    layers want fewer rows per program to keep enough programs in flight. Left to cuBLAS,
    which reaches 86-100% of the copy bandwidth there: the LM head, N = 8,192 (the 70B's o and
    down) and the 70B's wide and long layers. The 8B's gate_up and TP1 down went to cuBLAS too
    until the kernels took PDL (utils/pdl.py); since, the GEMV is faster on them in
    the whole model (the rule's first branch)."""
    if m != 1:
        return None
    if (8192 < n <= 32768 and 1024 <= k <= 4096) or (1024 <= n <= 4096 and 8192 < k <= 16384):
        # gate_up and the long down of an 8B-sized MLP: with PDL the GEMV's first weights and
        # the next kernel's launch overlap the neighbours, which cuBLAS's kernels cannot
        # (Llama-3.1-8B batch 1, 2 x H200: TP1 4.31 -> 4.23 ms a step, TP2 2.92 -> 2.87).
        # 4 rows a program: 8 was slower at TP1.
        return GemvTiles(block_n=4, block_k=1024)
    if not 1024 <= n < 8192 or not 1024 <= k <= 8192:
        return None
    block_n = 2 if n <= 2560 else 4 if n <= 3072 else 8 if n <= 4096 else 2
    return GemvTiles(block_n=block_n, block_k=1024)


def _operands_fit(x: torch.Tensor, weight: torch.Tensor, fp32_weight: bool = False) -> bool:
    """x [..., K] 16-bit and weight [N, K] K-contiguous, in x's dtype (or float32 where
    `fp32_weight`)."""
    dtype_ok = weight.dtype == x.dtype or (fp32_weight and weight.dtype == torch.float32)
    return (x.dtype in (torch.bfloat16, torch.float16) and dtype_ok
            and weight.dim() == 2 and weight.stride(1) == 1 and x.shape[-1] == weight.shape[1])


def router_tiles(x: torch.Tensor, weight: torch.Tensor) -> GemvTiles | None:
    """The tiles for a MoE router's logits at batch 1 (8-512 experts, N below `gemv_tiles`'
    range), or None: two expert rows a program. The router's cuBLAS kernel cannot launch
    early as this one can (PDL), and it sits between two kernels that do. A float32 router
    (DeepSeek's) takes 16-bit x as it is: the kernel widens x to float32 in registers, which
    is what casting x first does, and stores float32 logits (one launch instead of a cast
    and cuBLAS's two-kernel float32 GEMV)."""
    n, k = weight.shape[0], x.shape[-1]
    if not 8 <= n <= 512 or not 1024 <= k <= 8192 or x.numel() != k:
        return None
    return (GemvTiles(block_n=2, block_k=1024) if _operands_fit(x, weight, fp32_weight=True)
            else None)


def latent_tiles(x: torch.Tensor, weight: torch.Tensor) -> GemvTiles | None:
    """The tiles for MLA's latent projection at batch 1 (DeepSeek's kv_a_proj_with_mqa,
    kv_lora_rank + rope = 576 rows; models/deepseek_v2.py asks for it by name), or None: two
    rows a program. cuBLAS's kernel there cannot launch early (PDL) and sits between two
    kernels that do (DeepSeek-V2-Lite batch 1, RESULTS.md). Other layers of this width are
    not taken: `gemv_tiles` was not measured below 1,024 rows."""
    n, k = weight.shape[0], x.shape[-1]
    if not 512 < n < 1024 or not 1024 <= k <= 8192 or x.numel() != k:
        return None
    return GemvTiles(block_n=2, block_k=1024) if _operands_fit(x, weight) else None


def supports(x: torch.Tensor, weight: torch.Tensor) -> GemvTiles | None:
    """The tiles `gemv` would use for x [..., K] times weight [N, K], or None if not taken."""
    if not _operands_fit(x, weight):
        return None
    m = x.numel() // max(1, x.shape[-1])
    return gemv_tiles(m, weight.shape[0], weight.shape[1])


def gated_supports(x: torch.Tensor, weight: torch.Tensor) -> GemvTiles | None:
    """The tiles `gemv(..., gated=True)` would use for x [..., K] and a [gate | up] weight
    [2I, K], or None if not taken: where the plain product takes the kernel, with half its
    rows a program (each program reads as many gate rows as up rows)."""
    tiles = supports(x, weight)
    if tiles is None or weight.shape[0] % 2:
        return None
    return GemvTiles(block_n=max(2, tiles.block_n // 2), block_k=tiles.block_k,
                     num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         tiles: GemvTiles, gated: bool = False) -> torch.Tensor:
    """x [..., K] (one row in all) times weight [N, K]^T (+ bias [N]) -> [..., N] in x's
    dtype (float32 for a float32 weight: `router_tiles`). `gated`: weight is [gate | up] and
    the result silu(gate) * up, [..., N / 2] (no bias)."""
    k = x.shape[-1]
    if x.numel() != k:
        raise ValueError(f"gemv takes one row of x, got shape {tuple(x.shape)}")
    if gated and (bias is not None or weight.shape[0] % 2):
        raise ValueError("a gated gemv takes an even number of weight rows and no bias")
    x = x if x.stride(-1) == 1 else x.contiguous()
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    y = torch.empty((*x.shape[:-1], n), dtype=torch.promote_types(x.dtype, weight.dtype),
                    device=x.device)
    _gemv_kernel[(triton.cdiv(n, tiles.block_n),)](
        x, weight, bias if bias is not None else weight, y, n, weight.stride(0), K=k,
        HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, GATED=gated, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages, **pdl_kwargs(x.device, 1))
    return y
