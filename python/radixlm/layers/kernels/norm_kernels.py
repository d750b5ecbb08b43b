"""Fused RMSNorm, optionally with the residual add folded in, as one Triton kernel.

    rms_norm(x, w, eps)            -> w * (x * rsqrt(mean(x^2) + eps))
    rms_norm(x, w, eps, residual)  -> (rms_norm(x + residual), x + residual)

Numerics follow RMSNorm's PyTorch code (radixlm/layers/norm.py) step by step: x + residual is
rounded to the input dtype first (that rounded sum is both the new residual and what is
normalised); the norm runs in fp32 as x * rstd, then weight * that, then one rounding to the
input dtype. Only the mean differs from PyTorch's reduction in its last bits (summation order,
and sum / N with IEEE division where PyTorch multiplies by 1 / N). Nothing here is a mul feeding
an add outside the sum, so FMA contraction cannot change the rounding order.

Rows: x may be [N], [T, N] or [T, H, N] with any strides whose last one is 1 (e.g. per-head
q/k views of a fused qkv projection, for Qwen3's q/k norm); other layouts are copied to
contiguous first. Outputs are new contiguous tensors; inputs are never written.

`rms_norm_leading(x, w, eps, n)` normalises only the first n values of each row and copies the
rest as they are: MLA's latent row [c | k_rope] with c normalised, built in one launch (the
norm, then a concatenation, before).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# Elements one program normalises: rows are batched per program for small hidden sizes.
_TILE = 2048
# Largest hidden size the single-pass kernel takes (the whole row lives in registers).
MAX_HIDDEN = 32768


@triton.jit
def _rmsnorm_kernel(X, R, W, Out, ResOut, n_rows, n_cols, inner,
                    sx_outer, sx_inner, sr_outer, sr_inner, n_float, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                    PDL: tl.constexpr = False, N_NORM: tl.constexpr = 0):
    """N_NORM > 0: only a row's first N_NORM values are normalised (n_float == N_NORM), the
    rest stored as they are (`rms_norm_leading`)."""
    pdl_launch_dependents(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    norm_cols = cols < N_NORM if N_NORM > 0 else col_mask
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    # Row r of a [T, H, N] view starts at (r // H) * stride(0) + (r % H) * stride(1).
    outer = rows // inner
    in_row = rows % inner
    x_ptrs = X + (outer * sx_outer + in_row * sx_inner)[:, None] + cols[None, :]
    # The norm's weight is no kernel's output: loaded before the wait (utils/pdl.py).
    w = tl.load(W + cols, mask=norm_cols, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if N_NORM > 0:
        tail = x
        x = tl.where(norm_cols[None, :], x, 0.0)
    out_off = rows[:, None] * n_cols + cols[None, :]
    if HAS_RESIDUAL:
        r_ptrs = R + (outer * sr_outer + in_row * sr_inner)[:, None] + cols[None, :]
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        # The sum rounded to the activation dtype, as `x + residual` in PyTorch.
        s = (x + r).to(ResOut.dtype.element_ty)
        tl.store(ResOut + out_off, s, mask=mask)
        x = s.to(tl.float32)
    ms = tl.math.div_rn(tl.sum(x * x, axis=1), n_float)
    rstd = tl.math.rsqrt(ms + eps)
    y = w[None, :] * (x * rstd[:, None])
    if N_NORM > 0:
        y = tl.where(norm_cols[None, :], y, tail)
    tl.store(Out + out_off, y.to(Out.dtype.element_ty), mask=mask)


def _row_layout(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(t, inner, stride_outer, stride_inner) addressing t's rows of its last dim; t is copied
    to contiguous when its layout has no such description."""
    if t.stride(-1) != 1 and t.numel() > 0:
        t = t.contiguous()
    if t.dim() == 1:
        return t, 1, 0, 0
    if t.dim() == 2:
        return t, 1, t.stride(0), 0
    if t.dim() == 3:
        return t, max(t.shape[1], 1), t.stride(0), t.stride(1)
    try:
        t2 = t.view(-1, t.shape[-1])
    except RuntimeError:
        t2 = t.contiguous().view(-1, t.shape[-1])
    return t2, 1, t2.stride(0), 0


def supports(x: torch.Tensor, weight: torch.Tensor,
             residual: torch.Tensor | None = None) -> bool:
    """Inputs the kernel takes; the layer runs its PyTorch code for anything else."""
    n = x.shape[-1] if x.dim() else 0
    return (x.dim() >= 1 and 0 < n <= MAX_HIDDEN and weight.numel() == n
            and weight.is_contiguous()
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype)))


@functools.lru_cache(maxsize=None)
def launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps): depends on the hidden size only, so one compiled variant
    serves every batch size."""
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, _TILE // block_n)
    num_warps = min(16, max(1, rows * block_n // 512))
    return block_n, rows, num_warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """norm(x), or with a residual (norm(x + residual), x + residual); see the module doc."""
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = None if residual is None else torch.empty_like(out)
    n_rows = x.numel() // n if n else 0
    if n_rows == 0:
        return out if residual is None else (out, res_out)
    xv, inner, sx0, sx1 = _row_layout(x)
    # Same shapes, so both get the same `inner` (the row count is > 0).
    rv, _, sr0, sr1 = (xv, inner, 0, 0) if residual is None else _row_layout(residual)
    block_n, rows, num_warps = launch_config(n)
    grid = (triton.cdiv(n_rows, rows),)
    _rmsnorm_kernel[grid](
        xv, rv, weight, out, out if res_out is None else res_out,
        n_rows, n, inner, sx0, sx1, sr0, sr1, float(n), eps,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, ROWS=rows,
        num_warps=num_warps, **pdl_kwargs(x.device, n_rows // inner))
    return out if residual is None else (out, res_out)


def rms_norm_leading(x: torch.Tensor, weight: torch.Tensor, eps: float,
                     n_norm: int) -> torch.Tensor:
    """x [T, N] -> [T, N] (new, contiguous): each row's first n_norm values normalised with
    weight [n_norm] as `rms_norm` does, the other N - n_norm copied as they are."""
    n = x.shape[-1]
    assert x.dim() == 2 and 0 < n_norm <= n and weight.numel() == n_norm
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    xv, inner, sx0, sx1 = _row_layout(x)
    block_n, rows, num_warps = launch_config(n)
    _rmsnorm_kernel[(triton.cdiv(x.shape[0], rows),)](
        xv, xv, weight, out, out, x.shape[0], n, inner, sx0, sx1, 0, 0, float(n_norm), eps,
        HAS_RESIDUAL=False, BLOCK_N=block_n, ROWS=rows, N_NORM=n_norm, num_warps=num_warps,
        **pdl_kwargs(x.device, x.shape[0]))
    return out
