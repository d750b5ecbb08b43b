"""Small-batch GEMM: a decode step's narrow linear layers at 2-64 rows, on Hopper.

At decode batch sizes a linear layer reads its whole weight for a few dozen rows of x, so it is
bound by memory, and the narrow ones (o_proj and down_proj of small models: N <= 4,096 output
columns) are bound by latency: cuBLAS runs them at 17-60% of copy bandwidth (Qwen3-0.6B's
down_proj at 64 rows: 7.9 us for 6 MB, H200). They have too few output tiles to fill the GPU,
so this kernel also splits K: program (n, s) multiplies the weight tile [BLOCK_N, K / SPLIT_K]
by x^T on the tensor cores (the weight rows as the MMA's M side, the batch as its N side, padded
to 16) and the SPLIT_K programs of a tile meet in a float32 scratch.

Determinism: float32 addition is commutative but not associative, so the order in which atomic
additions land must not matter. Programs meet in pairs: programs 2j and 2j + 1 add into slot j
of the scratch (0 + a + b and 0 + b + a are the same bits), the last program of the tile (an
atomic counter) adds slot 0 and slot 1 in that order, stores the output in x's dtype and leaves
slots and counter zero for the next call. The result is the same on every call, as cuBLAS's.

The scratch is one per device, shared by all layers: kernels on one stream run one after the
other, and every launch leaves it zero, so CUDA graphs replay it as captured. Layers reserve it
when their weights are loaded (`reserve_scratch`), before any graph capture; a layer loaded
elsewhere and moved finds none (or one too small) and keeps F.linear.

Where it is taken (`small_batch_tiles`), from a sweep of tiles against F.linear in
benchmarks/results/issue12/small_batch_gemm/ (H200, each call timed inside a CUDA graph over
weight copies that overflow the L2): 2-64 rows, N <= 4,096, K >= 2,048 (o / down of
Qwen3-0.6B, Llama-3.2-1B, Llama-3.1-8B; Llama-3.2-1B's qkv). Wider layers (gate_up, the 8B
qkv) and the LM head keep cuBLAS, which reads them at 75-92% of copy bandwidth.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import radixlm.envs as envs

MAX_ROWS = 64           # rows of x the kernel takes (and the scratch holds)
MAX_N = 4096            # widest output it takes
MIN_K = 2048            # shallower products keep cuBLAS (measured even or slower)
BLOCK_N = 64            # weight rows a program takes
MIN_BLOCK_N = 16        # the narrowest tile allowed: bounds the counters (one per output tile)


@dataclass(frozen=True)
class SmallBatchTiles:
    block_m: int        # rows of x, padded (>= 16: the MMA's N side)
    block_n: int        # weight rows a program takes
    block_k: int        # K per loop step
    split_k: int        # programs per output tile: 1, 2 or 4 (pairs: module doc)
    num_warps: int = 4
    num_stages: int = 4


def small_batch_tiles(m: int, n: int, k: int) -> SmallBatchTiles | None:
    """Tiles for an [m, k] x [n, k]^T product, or None where cuBLAS is kept."""
    if not (2 <= m <= MAX_ROWS and n <= MAX_N and k >= MIN_K):
        return None
    split = 4 if n <= 2048 else 2
    tiles = SmallBatchTiles(block_m=max(16, triton.next_power_of_2(m)), block_n=BLOCK_N,
                            block_k=128, split_k=split)
    return tiles if k % (tiles.block_k * split) == 0 else None


@dataclass
class _Scratch:
    partials: torch.Tensor      # [2, MAX_ROWS, n] float32, zero between calls
    counters: torch.Tensor      # [cdiv(n, 64)] int32, zero between calls


_scratch: dict[torch.device, _Scratch] = {}


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    # Measured on an H200 only; NVIDIA only (a ROCm build reports MI300 as capability 9.4).
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] == 9


def _device_key(device: torch.device) -> torch.device:
    if device.type != "cuda":
        return device       # (the interpreter's tests)
    return torch.device("cuda", device.index if device.index is not None
                        else torch.cuda.current_device())


def reserve_scratch_for(device: torch.device, n: int) -> None:
    """Make `device`'s scratch hold outputs of n columns (kept if already wide enough)."""
    key = _device_key(device)
    have = _scratch.get(key)
    if have is None or have.partials.shape[2] < n:
        _scratch[key] = _Scratch(
            torch.zeros((2, MAX_ROWS, n), dtype=torch.float32, device=key),
            torch.zeros(triton.cdiv(n, MIN_BLOCK_N), dtype=torch.int32, device=key))


def reserve_scratch(weight: torch.Tensor) -> None:
    """After loading: reserve the device's scratch for this layer's output where the layer
    can take the kernel at some batch size (before any CUDA-graph capture)."""
    if not weight.is_cuda or weight.dtype not in (torch.bfloat16, torch.float16):
        return
    n, k = weight.shape
    if small_batch_tiles(MAX_ROWS, n, k) is not None \
            and _is_hopper(_device_key(weight.device).index):
        reserve_scratch_for(weight.device, n)


def supports(x: torch.Tensor, weight: torch.Tensor) -> SmallBatchTiles | None:
    """Tiles where `x @ weight^T` takes the kernel: x [m, K] 16-bit on a Hopper GPU, the
    weight in x's dtype with contiguous rows, a scratch reserved, the rule above, and
    RADIXLM_DISABLE_GEMV unset."""
    if (x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16)
            or weight.dtype != x.dtype or x.stride(1) != 1 or weight.stride(1) != 1
            or torch.compiler.is_compiling() or envs.disable_gemv()):
        return None
    tiles = small_batch_tiles(x.shape[0], weight.shape[0], weight.shape[1])
    if tiles is None:
        return None
    scratch = _scratch.get(_device_key(x.device))
    if scratch is None or scratch.partials.shape[2] < weight.shape[0]:
        return None
    return tiles


@triton.jit
def _small_batch_gemm_kernel(
    X, W, Bias, Y, Part, Count,
    M, N, K, stride_xm, stride_wn, stride_ym, stride_ps, stride_pm,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # The host checks K % (BLOCK_K * SPLIT_K) == 0; said here, the loads stay vectorised and
    # pipelined (without it Triton cannot prove a slice's start aligned: 2-byte loads).
    k_per = tl.multiple_of(K // SPLIT_K, BLOCK_K)
    lo = pid_k * k_per
    w_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + lo + offs_k[None, :]
    x_ptr = X + offs_m[:, None] * stride_xm + lo + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)      # acc[n, m] = y[m, n]
    for _ in range(0, k_per, BLOCK_K):
        w = tl.load(w_ptr, mask=n_mask[:, None], other=0.0)
        x = tl.load(x_ptr, mask=m_mask[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
        w_ptr += BLOCK_K
        x_ptr += BLOCK_K
    mask = n_mask[:, None] & m_mask[None, :]
    y_ptr = Y + offs_m[None, :] * stride_ym + offs_n[:, None]
    last = True
    if SPLIT_K > 1:
        part = Part + offs_m[None, :] * stride_pm + offs_n[:, None]
        tl.atomic_add(part + (pid_k // 2) * stride_ps, acc, mask=mask, sem="relaxed")
        # Every thread's addition is issued before the counter moves (the release below).
        tl.debug_barrier()
        last = tl.atomic_add(Count + pid_n, 1, sem="acq_rel") == SPLIT_K - 1
        if last:
            # The pair slots, read in a fixed order where the additions happened (L2: .cg
            # skips the L1) and zeroed for the next call.
            acc = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(part, tl.zeros_like(acc), mask=mask)
            if SPLIT_K == 4:
                acc += tl.load(part + stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(part + stride_ps, tl.zeros_like(acc), mask=mask)
            tl.store(Count + pid_n, 0)
    if last:
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=mask)


def small_batch_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     tiles: SmallBatchTiles) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype; `tiles` from
    `supports` (which also checked that the device's scratch is reserved)."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= tiles.block_m <= MAX_ROWS and k % (tiles.block_k * tiles.split_k) == 0
    scratch = _scratch[_device_key(x.device)]
    assert tiles.block_n >= MIN_BLOCK_N and n <= scratch.partials.shape[2]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _small_batch_gemm_kernel[(triton.cdiv(n, tiles.block_n), tiles.split_k)](
        x, weight, bias if bias is not None else y, y, scratch.partials, scratch.counters,
        m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        scratch.partials.stride(0), scratch.partials.stride(1),
        HAS_BIAS=bias is not None, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, SPLIT_K=tiles.split_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return y
