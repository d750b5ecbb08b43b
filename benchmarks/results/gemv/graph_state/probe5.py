"""probe4 with a one-function GEMV: K a runtime argument, 2 rows a program for every shape."""
import os, sys, time
import torch
import triton
import triton.language as tl
from radixlm.layers.kernels import gemv_kernels as G

@triton.jit
def _gemv_rt(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn, K,
             HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = tl.minimum(offs_n, N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_k
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs)
        x = tl.load(x_ptrs)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)

G._gemv_kernel = _gemv_rt
G.gemv_tiles = lambda m, n, k: G.GemvTiles(2, 1024) if m == 1 and 1024 <= n < 8192 and 1024 <= k <= 8192 and k % 1024 == 0 else None
exec(open(".devrun/probe4.py").read())
