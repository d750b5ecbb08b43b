"""Writing a step's new K and V into the pool: one kernel for both tensors.

Two PyTorch index_put calls per layer cost two launches of a generic scatter; at batch 1 that is
~3 us each, ~0.2 ms per step of a 32-layer model. One program per new token copies its K and V
rows (num_kv_heads * head_dim contiguous values each) to its slot, converting to the pool dtype.

An fp8 pool stores x / scale clamped to fp8's finite range (core/kv_quant.py): the values are
multiplied by 1 / scale in fp32 and rounded to nearest even, the same bits as `quantize`.

`store_rows` writes one tensor's rows the same way: MLA's latent pool (one row per token, K
and V at once), where PyTorch's index_put was one more non-PDL launch a layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.core.kv_quant import FP8_E4M3_MAX, is_fp8
from radixlm.layers.attention.kernels.common import next_pow2
from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait


@triton.jit
def _quantized(x, inv_scale, FP8_MAX: tl.constexpr):
    return tl.minimum(tl.maximum(x.to(tl.float32) * inv_scale, -FP8_MAX), FP8_MAX)


@triton.jit
def _store_kv_kernel(K, V, K_buf, V_buf, locs, stride_kt, stride_vt, stride_kbt, stride_vbt,
                     k_inv_scale, v_inv_scale,
                     ROW: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr,
                     PDL: tl.constexpr = False, HAS_V: tl.constexpr = True):
    """FP8_MAX > 0: the pool is fp8 (scale and clamp before the cast); 0: a plain cast.
    HAS_V False: K's rows only (V and V_buf are not read)."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)   # k, v and the slots are this step's (utils/pdl.py)
    t = tl.program_id(0)
    slot = tl.load(locs + t).to(tl.int64)
    for start in range(0, ROW, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(K + t.to(tl.int64) * stride_kt + offs, mask=mask)
        if FP8_MAX > 0:
            k = _quantized(k, k_inv_scale, FP8_MAX)
        tl.store(K_buf + slot * stride_kbt + offs, k.to(K_buf.dtype.element_ty), mask=mask)
        if HAS_V:
            v = tl.load(V + t.to(tl.int64) * stride_vt + offs, mask=mask)
            if FP8_MAX > 0:
                v = _quantized(v, v_inv_scale, FP8_MAX)
            tl.store(V_buf + slot * stride_vbt + offs, v.to(V_buf.dtype.element_ty), mask=mask)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def store_kv(k: torch.Tensor, v: torch.Tensor | None, k_buf: torch.Tensor,
             v_buf: torch.Tensor | None, locs: torch.Tensor, k_scale: float = 1.0,
             v_scale: float = 1.0) -> None:
    """k/v [T, Hk, D] -> k_buf/v_buf[locs[t]] (a token whose heads are not one contiguous row,
    e.g. a strided view, is copied to one first). k_scale/v_scale: an fp8 pool's scales (the
    stored value is x / scale); ignored for other pool dtypes. v and v_buf None: K's rows
    only (`store_rows`)."""
    num_tokens = locs.numel()
    if num_tokens == 0:
        return
    row = k.shape[1] * k.shape[2]
    k = _rows_contiguous(k)
    has_v = v is not None
    v, v_buf = (_rows_contiguous(v), v_buf) if has_v else (k, k_buf)
    fp8_max = FP8_E4M3_MAX if is_fp8(k_buf.dtype) else 0.0
    _store_kv_kernel[(num_tokens,)](k, v, k_buf, v_buf, locs, k.stride(0), v.stride(0),
                                    k_buf.stride(0), v_buf.stride(0), 1.0 / k_scale,
                                    1.0 / v_scale, ROW=row, BLOCK=min(next_pow2(row), 2048),
                                    FP8_MAX=fp8_max, HAS_V=has_v, num_warps=4,
                                    **pdl_kwargs(k.device, num_tokens))


def store_rows(x: torch.Tensor, buf: torch.Tensor, locs: torch.Tensor) -> None:
    """x [T, H, D] -> buf[locs[t]]: one tensor's rows, e.g. MLA's latent pool (K and V at
    once)."""
    store_kv(x, None, buf, None, locs)
