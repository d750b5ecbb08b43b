import torch, triton, triton.language as tl


@triton.jit
def _skinny(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    w_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptr = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    k_per = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    lo = pid_k * k_per
    hi = tl.minimum(lo + k_per, K)
    for k in range(lo, hi, BLOCK_K):
        w = tl.load(w_ptr + k, mask=n_mask[:, None], other=0.0)
        x = tl.load(x_ptr + k, mask=m_mask[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    y_ptr = Y + offs_m[None, :] * stride_ym + offs_n[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(y_ptr, acc, mask=mask, sem="relaxed")


def skinny(x, w, bm, bn, bk, split, warps, stages, out=None):
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype if split == 1 else torch.float32, device=x.device)
    _skinny[(triton.cdiv(n, bn), split)](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
                                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                         num_warps=warps, num_stages=stages)
    return out

