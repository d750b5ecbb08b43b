"""Fused SiLU-and-mul: [..., 2I] = [gate | up] -> silu(gate) * up, [..., I], one Triton kernel.

Rounding follows `F.silu(gate) * up` in PyTorch: silu is computed in fp32 (x / (1 + exp(-x)),
IEEE division) and rounded to the activation dtype, then multiplied by `up` in fp32 and rounded
again (no mul feeds an add, so FMA contraction changes nothing). Triton's exp is the fast one,
so results may differ from PyTorch's in the last bits of the fp32 intermediate (after bf16/fp16
rounding: rarely, by one ulp).

Input rows may have any stride (the last dim's must be 1, else it is copied); the output is a
new contiguous tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.utils.pdl import pdl_kwargs, pdl_launch_dependents, pdl_wait

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(X, Out, n_cols, stride_x, stride_out, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)   # x is the previous kernel's output (utils/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = X + row * stride_x
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate))
    silu = silu.to(Out.dtype.element_ty).to(tl.float32)   # F.silu's output, in the act dtype
    tl.store(Out + row * stride_out + cols, (silu * up).to(Out.dtype.element_ty), mask=mask)


def supports(x: torch.Tensor) -> bool:
    return (x.dim() >= 1 and x.shape[-1] % 2 == 0
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    two_i = x.shape[-1]
    i = two_i // 2
    out = torch.empty((*x.shape[:-1], i), dtype=x.dtype, device=x.device)
    n_rows = out.numel() // i if i else 0
    if n_rows == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        x2 = x.view(-1, two_i)
    except RuntimeError:
        x2 = x.reshape(-1, two_i)   # copies: leading dims that do not flatten into rows
    block = min(_BLOCK, triton.next_power_of_2(i))
    grid = (n_rows, triton.cdiv(i, block))
    _silu_and_mul_kernel[grid](x2, out, i, x2.stride(0), i, BLOCK=block,
                               num_warps=max(1, min(4, block // 256)),
                               **pdl_kwargs(x2.device, n_rows))
    return out
