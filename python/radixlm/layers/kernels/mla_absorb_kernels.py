"""MLA's absorbed per-head products for one token (the decode step at batch 1).

With weight absorption (models/deepseek_v2.py) each head projects its query into the latent
space and its latent-space output back, through its slices of kv_b_proj's weight:

    q_lat[h] = q_nope[h] @ W_UK[h]        W_UK[h] [NOPE, LORA]   (LORA contiguous)
    o[h]     = o_lat[h] @ W_UV[h]^T       W_UV[h] [V, LORA]      (LORA contiguous)

For one token these are per-head GEMVs that only stream the weights (2 MB each for
DeepSeek-V2-Lite). torch.bmm runs them as cuBLAS kernels of ~3-6 us that cannot launch early,
and the query's then needs a concatenation with its rotated part before attention. Here:

  * `absorb_query` writes q_full[h] = [q_lat[h] | q_rope[h]], the attention kernel's query,
    in one launch: program (h, block of LORA columns) walks W_UK[h]'s NOPE rows for its
    columns; the head's first program also copies q_rope.
  * `absorb_output` writes o [H * V], o_proj's input, directly: program (h, block of V rows)
    reads those rows of W_UV[h] (each LORA contiguous) and sums them against o_lat[h].

Both accumulate in float32 and round once, as cuBLAS does, and take PDL (utils/pdl.py): the
first weight tile is requested before waiting for the kernel that writes their input.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

# Latent columns (query) / value rows (output) per program: 128 / 256 programs for
# DeepSeek-V2-Lite's 16 heads, each reading 16 KB of weights.
QUERY_BLOCK_L = 64
OUTPUT_BLOCK_V = 8


@triton.jit
def _absorb_query_kernel(QN, W, QR, Out, stride_qnh, stride_wh, stride_wn, stride_qrh,
                         stride_oh, NOPE: tl.constexpr, LORA: tl.constexpr,
                         ROPE: tl.constexpr, BLOCK_NOPE: tl.constexpr, BLOCK_L: tl.constexpr,
                         BLOCK_R: tl.constexpr, PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    h = tl.program_id(0)
    lb = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_NOPE)
    offs_l = lb * BLOCK_L + tl.arange(0, BLOCK_L)
    n_mask = offs_n < NOPE
    l_mask = offs_l < LORA
    w = tl.load(W + h.to(tl.int64) * stride_wh + offs_n[:, None] * stride_wn + offs_l[None, :],
                mask=n_mask[:, None] & l_mask[None, :], other=0.0)
    pdl_wait(PDL)   # q_nope and q_rope are this step's
    qn = tl.load(QN + h * stride_qnh + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    q_lat = tl.sum(w.to(tl.float32) * qn[:, None], axis=0)
    tl.store(Out + h * stride_oh + offs_l, q_lat.to(Out.dtype.element_ty), mask=l_mask)
    if lb == 0:
        offs_r = tl.arange(0, BLOCK_R)
        r_mask = offs_r < ROPE
        qr = tl.load(QR + h * stride_qrh + offs_r, mask=r_mask, other=0.0)
        tl.store(Out + h * stride_oh + LORA + offs_r, qr.to(Out.dtype.element_ty), mask=r_mask)


@triton.jit
def _absorb_output_kernel(OL, W, Out, stride_olh, stride_wh, stride_wv, V: tl.constexpr,
                          LORA: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_L: tl.constexpr,
                          PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    h = tl.program_id(0)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_l = tl.arange(0, BLOCK_L)
    v_mask = offs_v < V
    l_mask = offs_l < LORA
    w = tl.load(W + h.to(tl.int64) * stride_wh + offs_v[:, None] * stride_wv + offs_l[None, :],
                mask=v_mask[:, None] & l_mask[None, :], other=0.0)
    pdl_wait(PDL)   # o_lat is this step's attention output
    ol = tl.load(OL + h * stride_olh + offs_l, mask=l_mask, other=0.0).to(tl.float32)
    o = tl.sum(w.to(tl.float32) * ol[None, :], axis=1)
    tl.store(Out + h * V + offs_v, o.to(Out.dtype.element_ty), mask=v_mask)


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor, q_rope: torch.Tensor
                 ) -> torch.Tensor:
    """q_nope [1, H, NOPE], w_uk [H, NOPE, LORA] (LORA contiguous), q_rope [1, H, ROPE] ->
    q_full [1, H, LORA + ROPE] = [q_nope[h] @ w_uk[h] | q_rope[h]] in q_nope's dtype."""
    _, nh, nope = q_nope.shape
    lora, rope = w_uk.shape[2], q_rope.shape[2]
    assert q_nope.shape[0] == 1 and q_nope.stride(-1) == 1 and q_rope.stride(-1) == 1
    assert w_uk.shape[:2] == (nh, nope) and w_uk.stride(-1) == 1
    out = torch.empty((1, nh, lora + rope), dtype=q_nope.dtype, device=q_nope.device)
    _absorb_query_kernel[(nh, triton.cdiv(lora, QUERY_BLOCK_L))](
        q_nope, w_uk, q_rope, out, q_nope.stride(1), w_uk.stride(0), w_uk.stride(1),
        q_rope.stride(1), out.stride(1), NOPE=nope, LORA=lora, ROPE=rope,
        BLOCK_NOPE=triton.next_power_of_2(nope), BLOCK_L=QUERY_BLOCK_L,
        BLOCK_R=triton.next_power_of_2(rope), num_warps=4, **pdl_kwargs(q_nope.device, 1))
    return out


def absorb_output(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o_lat [1, H, LORA], w_uv [H, V, LORA] (LORA contiguous) -> o [1, H * V] with
    o[h * V + v] = o_lat[h] . w_uv[h, v], in o_lat's dtype."""
    _, nh, lora = o_lat.shape
    v = w_uv.shape[1]
    assert o_lat.shape[0] == 1 and o_lat.stride(-1) == 1
    assert w_uv.shape[0] == nh and w_uv.shape[2] == lora and w_uv.stride(-1) == 1
    out = torch.empty((1, nh * v), dtype=o_lat.dtype, device=o_lat.device)
    _absorb_output_kernel[(nh, triton.cdiv(v, OUTPUT_BLOCK_V))](
        o_lat, w_uv, out, o_lat.stride(1), w_uv.stride(0), w_uv.stride(1), V=v, LORA=lora,
        BLOCK_V=OUTPUT_BLOCK_V, BLOCK_L=triton.next_power_of_2(lora), num_warps=4,
        **pdl_kwargs(o_lat.device, 1))
    return out
