"""How the KV cache stores K and V when its dtype is not the model's (`--kv-cache-dtype`).

With fp8_e4m3 the pool (mem_cache/pools.py) keeps one byte per value: x / scale, clamped to
fp8's finite range and rounded to nearest even, with one scale for K and one for V per layer
(plain floats, so CUDA graphs capture them as constants): 1.0, or the checkpoint's own
(`CheckpointKVScales`). Whoever reads the pool multiplies by the scale. These helpers are the
torch side of that contract (the pool's set_kv and the torch_native backend); the Triton kernels
(layers/attention/kernels/) do the same in registers. They live here, at the bottom of the
package, because mem_cache/, layers/ and models/ use them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

# --kv-cache-dtype -> the storage dtype ("auto": the model's dtype).
KV_STORAGE_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn}
FP8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max     # 448.0


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the KV pool stores K and V in for `--kv-cache-dtype` (a ValueError naming the
    flag for an unknown value)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in KV_STORAGE_DTYPES:
        raise ValueError(f"--kv-cache-dtype: must be 'auto' or one of "
                         f"{sorted(KV_STORAGE_DTYPES)}, got {kv_cache_dtype!r}")
    return KV_STORAGE_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def is_valid_scale(scale: float) -> bool:
    """Whether `scale` can scale a KV cache: a positive finite number."""
    return math.isfinite(scale) and scale > 0


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """`x` in the storage dtype `dtype`: for fp8, x / scale clamped to +-448 (a plain cast could
    turn what overflows into NaN) and rounded to nearest even; other dtypes, a plain cast."""
    if not is_fp8(dtype):
        return x.to(dtype)
    # The reciprocal times x in fp32, as the store kernel computes it: both store the same bits.
    return (x.float() * (1.0 / scale)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored values back in the compute dtype `dtype`: x * scale (only a cast when the scale is
    1; fp8 -> 16-bit or fp32 is exact)."""
    out = x.to(dtype)
    return out if scale == 1.0 else out * scale


# KV cache scales as FP8 checkpoints ship them (names without the "model." prefix): one K and
# one V scale per layer (compressed-tensors' kv_cache_scheme, vLLM's FP8 format), one scale
# for both (AutoFP8's kv_scale), or the k/v projections' output scales (older llm-compressor).
# q_scale and prob_output_scale calibrate attention computed in fp8; radixlm keeps queries and
# probabilities in the compute dtype, so they are taken and not used.
_KV_SCALE_NAME = re.compile(r"layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale|"
                            r"k_proj\.output_scale|v_proj\.output_scale|q_scale|prob_output_scale)")
_WHICH = {"k_scale": "k", "k_proj.output_scale": "k", "v_scale": "v", "v_proj.output_scale": "v",
          "kv_scale": "kv", "q_scale": "", "prob_output_scale": ""}


@dataclass
class CheckpointKVScales:
    """The KV cache scales a checkpoint holds, collected while its weights load (`take`), for
    the pool of `--kv-cache-dtype fp8_e4m3` (`per_layer`). Values stored = K / k_scale.
    They are checked only when an fp8 pool asks for them: a 16-bit pool does not use them,
    so a checkpoint whose scales it could not use (per-head ones, say) still loads there."""

    k: dict[int, tuple[str, torch.Tensor]] = field(default_factory=dict)
    v: dict[int, tuple[str, torch.Tensor]] = field(default_factory=dict)

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """Record `name` if it is a KV scale (True), else leave it to the caller (False)."""
        m = _KV_SCALE_NAME.fullmatch(name)
        if m is None:
            return False
        which, layer = _WHICH[m.group(2)], int(m.group(1))
        value = (name, tensor.detach().float().cpu())
        if "k" in which:
            self.k[layer] = value
        if "v" in which:
            self.v[layer] = value
        return True

    @property
    def empty(self) -> bool:
        """Whether the checkpoint had no K or V scale."""
        return not self.k and not self.v

    def per_layer(self, num_layers: int) -> tuple[list[float], list[float]] | None:
        """(K scales, V scales) of layers 0..num_layers-1, or None when the checkpoint has none.
        A ValueError naming the tensor for a scale no pool can use (not one positive finite
        number), and naming the layers when only some have scales (theirs would be a guess)."""
        if self.empty:
            return None
        for kind, found in (("K", self.k), ("V", self.v)):
            missing = [i for i in range(num_layers) if i not in found]
            if missing:
                raise ValueError(f"the checkpoint has KV cache scales for some layers but no "
                                 f"{kind} scale for layer(s) {missing[:8]}; run with "
                                 f"--kv-cache-dtype auto, which does not use them")
        return ([_checked(*self.k[i]) for i in range(num_layers)],
                [_checked(*self.v[i]) for i in range(num_layers)])


def _checked(name: str, tensor: torch.Tensor) -> float:
    if tensor.numel() != 1:
        raise ValueError(f"checkpoint tensor {name!r} holds {tensor.numel()} KV cache scales; "
                         f"an fp8 KV cache takes one scale per layer for K and for V (run with "
                         f"--kv-cache-dtype auto, which does not use them)")
    value = tensor.item()
    if not is_valid_scale(value):
        raise ValueError(f"checkpoint tensor {name!r}: a KV cache scale must be a positive "
                         f"finite number, got {value}")
    return value
