"""Rotary position embedding (the HF "rotate half" layout), with Llama-3, linear and YaRN
scaling. (DeepSeek's interleaved pairs are permuted into this layout at load time, see
models/deepseek_v2.py.)

On CUDA, q and k are rotated in place by one Triton kernel
(radixlm/layers/kernels/rotary_kernels.py); elsewhere, or with RADIXLM_DISABLE_FUSED_OPS=1, the
PyTorch code below returns rotated copies. Either way, use the returned tensors. The scaling
comes parsed and checked from the model config (core/model_config.py: RopeScaling).
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import nn

from radixlm.core.model_config import RopeScaling
from radixlm.layers.kernels import use_fused
from radixlm.layers.norm import RMSNorm


def _inv_freq(head_dim: int, base: float, scaling: RopeScaling | None) -> torch.Tensor:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    if scaling.rope_type == "llama3":
        # Low frequencies are divided by `factor`, high ones kept, a smooth blend in between.
        factor = scaling.factor
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        old_ctx = float(scaling.original_max_position_embeddings)
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        out = torch.where(wavelen > old_ctx / low, inv / factor, blended)
        return torch.where(wavelen < old_ctx / high, inv, out)
    if scaling.rope_type == "yarn":
        return _yarn_inv_freq(inv, head_dim, base, scaling)
    raise ValueError(f"unsupported rope_scaling type {scaling.rope_type!r}")


def _yarn_find_dim(rotations: float, head_dim: int, base: float, old_ctx: int) -> float:
    """The dimension whose wavelength fits `rotations` turns into the original context."""
    return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn_inv_freq(inv: torch.Tensor, head_dim: int, base: float,
                   scaling: RopeScaling) -> torch.Tensor:
    """YaRN: fast-rotating dimensions (more than beta_fast turns over the original context)
    keep their frequency, slow ones (under beta_slow turns) are interpolated by `factor`, a
    linear ramp in between."""
    old_ctx = int(scaling.original_max_position_embeddings or 0)
    low = _yarn_find_dim(scaling.beta_fast, head_dim, base, old_ctx)
    high = _yarn_find_dim(scaling.beta_slow, head_dim, base, old_ctx)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp          # 1: extrapolate (keep the frequency), 0: interpolate
    return inv / scaling.factor * (1 - keep) + inv * keep


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched by `factor`."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_magnitude(scaling: RopeScaling | None) -> float:
    """What cos/sin are multiplied by: YaRN's attention factor (given, or from mscale /
    mscale_all_dim when both are set, else from the factor alone); 1 otherwise."""
    if scaling is None or scaling.rope_type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return (yarn_mscale(scaling.factor, scaling.mscale)
                / yarn_mscale(scaling.factor, scaling.mscale_all_dim))
    return yarn_mscale(scaling.factor)


# One cos/sin table per distinct (head_dim, length, base, scaling, device), shared by every
# layer: a table for a 128k context is tens of MB, and a model has dozens of layers. Weak
# values, so a table goes away with the last model that uses it.
_TABLES: "weakref.WeakValueDictionary[tuple, torch.Tensor]" = weakref.WeakValueDictionary()


def _cos_sin_table(head_dim: int, max_position: int, base: float,
                   scaling: RopeScaling | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[max_position, head_dim] cos and sin of each rotation (duplicated for both halves,
    times YaRN's magnitude), on the current default device."""
    device = torch.empty(0).device
    key = (head_dim, max_position, base, scaling, str(device))
    cos, sin = _TABLES.get(key + ("cos",)), _TABLES.get(key + ("sin",))
    if cos is None or sin is None:
        inv = _inv_freq(head_dim, base, scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv)
        mag = rope_magnitude(scaling)
        cos = (torch.cat([freqs.cos(), freqs.cos()], -1) * mag).float().to(device)
        sin = (torch.cat([freqs.sin(), freqs.sin()], -1) * mag).float().to(device)
        _TABLES[key + ("cos",)], _TABLES[key + ("sin",)] = cos, sin
    return cos, sin


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: RopeScaling | None = None):
        super().__init__()
        self.head_dim = head_dim
        cos, sin = _cos_sin_table(head_dim, max_position, base, scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None):
        """q: [T, Hq, D], k: [T, Hk, D]; returns them rotated, in the input dtype: in place on
        the fused path (q/k may be strided views, e.g. of a fused qkv output), else copies.
        q_norm / k_norm: per-head RMSNorms applied first (Qwen3), in the same kernel when
        fused."""
        if use_fused(q):
            from radixlm.layers.kernels import rotary_kernels
            norm = _fusable_norms(q_norm, k_norm, self.head_dim)
            if (rotary_kernels.supports(positions, q, k, self.cos, self.head_dim)
                    and (q_norm is None or norm is not None)):
                return rotary_kernels.rotary_embedding_(positions, q, k, self.cos, self.sin,
                                                        self.head_dim, halves_equal=True,
                                                        qk_norm=norm)
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _fusable_norms(q_norm: RMSNorm | None, k_norm: RMSNorm | None,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(q weight, k weight, eps) when the rotary kernel can apply both norms itself."""
    if q_norm is None or k_norm is None or q_norm.eps != k_norm.eps:
        return None
    weights = (q_norm.weight, k_norm.weight)
    if any(w.shape != (head_dim,) or w.stride(0) != 1 for w in weights):
        return None
    return q_norm.weight, k_norm.weight, q_norm.eps


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)
