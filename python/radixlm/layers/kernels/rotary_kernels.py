"""Rotary embedding applied in place to q and k, one Triton kernel for both.

The "rotate half" (GPT-NeoX / HF Llama) layout, the only one radixlm/layers/rotary.py builds:
with x = [x1 | x2] split at D/2 and the module's [max_position, D] cos/sin caches,

    out1 = x1 * cos[:D/2] - x2 * sin[:D/2]
    out2 = x2 * cos[D/2:] + x1 * sin[D/2:]

in fp32, each product and sum rounded separately (no FMA), rounded once to the tensor's dtype:
the same operations, in the same order, as the PyTorch code, so results match it exactly.
Positions are not bounds-checked (PyTorch's indexing would raise): they must be < max_position.

q: [T, Hq, D] (or [T, Hq * D]), k: [T, Hk, D] (or [T, Hk * D]), any token and head strides
with a unit stride in the last dim, e.g. views of a fused qkv projection's output; they are
rotated where they lie. A tensor with a non-unit last stride is rotated in a contiguous copy
instead, so callers must use the returned tensors.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# Elements of each half one program rotates (heads are batched per program): 512 was fastest on
# an H200 for head dims 64 and 128 at 256 and 8192 tokens (1024 within 5%).
_TILE = 512
# No FMA contraction (x1 * c1 - x2 * s1 would become one fma): PyTorch rounds each product.
# The launch option costs a few microseconds of host time per call (nothing under CUDA graphs).
_LAUNCH = dict(enable_fp_fusion=False)


@triton.jit
def _rotate_heads(X, t, head_block, n_heads, stride_t, stride_h, c1, c2, s1, s2, d, d_mask,
                  W, eps, HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr):
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads < n_heads)[:, None] & d_mask[None, :]
    ptrs = X + t * stride_t + heads[:, None].to(tl.int64) * stride_h + d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        # Qwen3's per-head RMSNorm first, as norm_kernels does it: fp32, x * rstd, then the
        # weight, rounded to the tensor's dtype (what the rotation then reads back).
        ms = tl.math.div_rn(tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1), 2.0 * HALF)
        rstd = tl.math.rsqrt(ms + eps)
        w1 = tl.load(W + d, mask=d_mask, other=0.0).to(tl.float32)
        w2 = tl.load(W + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        x1 = (w1[None, :] * (x1 * rstd[:, None])).to(X.dtype.element_ty).to(tl.float32)
        x2 = (w2[None, :] * (x2 * rstd[:, None])).to(X.dtype.element_ty).to(tl.float32)
    o1 = x1 * c1[None, :] - x2 * s1[None, :]
    o2 = x2 * c2[None, :] + x1 * s2[None, :]
    tl.store(ptrs, o1.to(X.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, o2.to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(Q, K, Cos, Sin, Pos, QW, KW, eps, n_q_heads, n_k_heads, n_q_blocks,
                 stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, stride_sin,
                 HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                 HALVES_EQUAL: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)   # positions, q and k are this step's (utils/pdl.py)
    t = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    pos = tl.load(Pos + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    cos_row = Cos + pos * stride_cos
    sin_row = Sin + pos * stride_sin
    c1 = tl.load(cos_row + d, mask=d_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row + d, mask=d_mask, other=0.0).to(tl.float32)
    if HALVES_EQUAL:   # the caller vouches cos[:, :D/2] == cos[:, D/2:] (and sin's)
        c2 = c1
        s2 = s1
    else:
        c2 = tl.load(cos_row + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_row + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
    if block < n_q_blocks:
        _rotate_heads(Q, t, block, n_q_heads, stride_qt, stride_qh, c1, c2, s1, s2, d, d_mask,
                      QW, eps, HALF, BLOCK_H, NORM)
    else:
        _rotate_heads(K, t, block - n_q_blocks, n_k_heads, stride_kt, stride_kh, c1, c2, s1, s2,
                      d, d_mask, KW, eps, HALF, BLOCK_H, NORM)


def _as_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    if x.dim() == 2:
        x = x.view(x.shape[0], -1, head_dim)   # a view for any row stride (last dim split)
    if x.stride(-1) != 1 and x.numel() > 0:
        x = x.contiguous()
    return x


def _heads_ok(x: torch.Tensor, head_dim: int) -> bool:
    if x.dim() == 3:
        return x.shape[-1] == head_dim
    return x.dim() == 2 and x.shape[-1] % head_dim == 0


def supports(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             head_dim: int) -> bool:
    ok_dtype = (torch.float32, torch.float16, torch.bfloat16)
    return (head_dim % 2 == 0 and _heads_ok(q, head_dim) and _heads_ok(k, head_dim)
            and q.dtype in ok_dtype and k.dtype in ok_dtype
            and positions.dim() == 1 and not positions.is_floating_point()
            and q.shape[0] == k.shape[0] == positions.shape[0]
            and cos.dim() == 2 and cos.shape[-1] == head_dim)


@functools.lru_cache(maxsize=None)
def launch_config(head_dim: int, n_q_heads: int, n_k_heads: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_H, num_warps): BLOCK_D covers half a head, BLOCK_H heads per program."""
    block_d = triton.next_power_of_2(head_dim // 2)
    block_h = max(1, min(_TILE // block_d, triton.next_power_of_2(max(n_q_heads, n_k_heads))))
    num_warps = max(1, min(4, block_h * block_d // 256))
    return block_d, block_h, num_warps


def rotary_embedding_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, head_dim: int | None = None,
                      halves_equal: bool = False,
                      qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (see the module doc); returns them (in their own shapes).
    halves_equal: the caches' two halves are equal (RotaryEmbedding builds them so), and the
    kernel reads only the first. qk_norm: (q weight, k weight, eps) of a per-head RMSNorm
    applied first, in the same kernel (Qwen3's q/k norm: two launches and two copies fewer)."""
    d = head_dim or cos.shape[-1]
    q3, k3 = _as_heads(q, d), _as_heads(k, d)
    n_tokens = q3.shape[0]
    if n_tokens == 0:
        return q, k
    if positions.stride(0) != 1:
        positions = positions.contiguous()
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    hq, hk = q3.shape[1], k3.shape[1]
    block_d, block_h, num_warps = launch_config(d, hq, hk)
    n_q_blocks = triton.cdiv(hq, block_h)
    grid = (n_tokens, n_q_blocks + triton.cdiv(hk, block_h))
    q_w, k_w, eps = qk_norm if qk_norm is not None else (q3, k3, 0.0)
    _rope_kernel[grid](q3, k3, cos, sin, positions, q_w, k_w, eps, hq, hk, n_q_blocks,
                       q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                       cos.stride(0), sin.stride(0),
                       HALF=d // 2, BLOCK_D=block_d, BLOCK_H=block_h, HALVES_EQUAL=halves_equal,
                       NORM=qk_norm is not None, num_warps=num_warps, **_LAUNCH,
                       **pdl_kwargs(q3.device, n_tokens))
    return q3.view(q.shape), k3.view(k.shape)
