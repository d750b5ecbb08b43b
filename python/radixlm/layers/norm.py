"""RMSNorm, with the residual add folded in.

On CUDA this runs one fused Triton kernel (radixlm/layers/kernels/norm_kernels.py: the add, the
norm and both stores in one pass); elsewhere, or with RADIXLM_DISABLE_FUSED_OPS=1, the PyTorch
code below, whose rounding the kernel follows.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.layers.kernels import use_fused


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Compute in float32 like the reference implementations, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x), or with a residual: (norm(x + residual), x + residual)."""
        if use_fused(x):
            from radixlm.layers.kernels import norm_kernels
            if norm_kernels.supports(x, self.weight, residual):
                return norm_kernels.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def qk_rms_norm(qk: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm,
                num_q_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head norms of q and k. qk [T, Hq + Hk, D] views the adjacent q and k heads of
    the fused projection; on CUDA one kernel normalises both (one launch instead of two per
    layer). Returns (q [T, Hq, D], k [T, Hk, D])."""
    if use_fused(qk) and q_norm.eps == k_norm.eps:
        from radixlm.layers.kernels import norm_kernels
        if norm_kernels.supports(qk, q_norm.weight) and k_norm.weight.is_contiguous():
            out = norm_kernels.rms_norm(qk, q_norm.weight, q_norm.eps, weight2=k_norm.weight,
                                        split=num_q_heads)
            return out[:, :num_q_heads], out[:, num_q_heads:]
    return q_norm(qk[:, :num_q_heads]), k_norm(qk[:, num_q_heads:])
