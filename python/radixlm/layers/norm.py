"""RMSNorm, with the residual add folded in.

On CUDA this runs one fused Triton kernel (radixlm/layers/kernels/norm_kernels.py: the add, the
norm and both stores in one pass); elsewhere, or with RADIXLM_DISABLE_FUSED_OPS=1, the PyTorch
code below, whose rounding the kernel follows.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.kernels import use_fused


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward_leading(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """x [T, N] with this norm applied to each row's first `width` values (the norm's
        size), the rest copied: MLA's latent row [c | k_rope] with c normalised. A new tensor."""
        if use_fused(x):
            from radixlm.layers.kernels import norm_kernels
            if norm_kernels.supports(x[..., :width], self.weight) and x.dim() == 2:
                return norm_kernels.rms_norm_leading(x, self.weight, self.eps, width)
        return torch.cat([self._norm(x[..., :width]), x[..., width:]], dim=-1)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Compute in float32 like the reference implementations, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                reduce: TPGroup | None = None):
        """norm(x), or with a residual: (norm(x + residual), x + residual). `reduce`: x is this
        rank's partial sum over that tensor-parallel group, summed here first (with the add and
        the norm in one kernel where the group has one: distributed/fused_all_reduce_norm.py)."""
        if reduce is not None and reduce.size > 1:
            if residual is not None:
                fused = reduce.all_reduce_rms_norm(x, residual, self.weight, self.eps)
                if fused is not None:
                    return fused
            x = reduce.all_reduce(x)
        if use_fused(x):
            from radixlm.layers.kernels import norm_kernels
            if norm_kernels.supports(x, self.weight, residual):
                return norm_kernels.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
