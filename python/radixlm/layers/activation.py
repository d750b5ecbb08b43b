"""SiLU-and-multiply for gated MLPs: silu(gate) * up over a fused [gate | up] tensor.

On CUDA one fused Triton kernel (radixlm/layers/kernels/activation_kernels.py); elsewhere, or
with RADIXLM_DISABLE_FUSED_OPS=1, the PyTorch code below.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.layers.kernels import use_fused


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_fused(x):
        from radixlm.layers.kernels import activation_kernels
        if activation_kernels.supports(x):
            return activation_kernels.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
