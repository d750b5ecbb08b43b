"""How the KV cache stores K and V when its dtype is not the model's (`--kv-cache-dtype`).

With fp8_e4m3 the pool (mem_cache/pools.py) keeps one byte per value: x / scale, clamped to
fp8's finite range and rounded to nearest even, with one scale for K and one for V (plain
floats, so CUDA graphs capture them as constants). Whoever reads the pool multiplies by the
scale. These helpers are the torch side of that contract (the pool's set_kv and the
torch_native backend); the Triton kernels (layers/attention/kernels/) do the same in registers.
They live here, at the bottom of the package, because both mem_cache/ and layers/ use them.
"""

from __future__ import annotations

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
