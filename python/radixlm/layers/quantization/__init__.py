"""Quantized linear layers: FP8 and 4-bit weights (issue 17).

    spec.py           the flag and the checkpoint's quantization_config -> QuantSpec (checks)
    method.py         QuantizedLinearMethod: what the methods share (spec, input flattening)
    fp8.py / int4.py  the LinearMethods (layers/linear.py) that load, repack and multiply
    *_kernels.py      their Triton kernels and torch references

The loader turns a spec into one method (`linear_method_for`) and builds the model with it as
every linear layer's default; embeddings and the LM head stay in the compute dtype.
"""

from __future__ import annotations

from radixlm.layers.linear import LinearMethod
from radixlm.layers.quantization.spec import QuantSpec, resolve_quant_spec

__all__ = ["QuantSpec", "linear_method_for", "resolve_quant_spec"]


def linear_method_for(spec: QuantSpec | None) -> LinearMethod | None:
    if spec is None:
        return None
    if spec.method == "fp8":
        from radixlm.layers.quantization.fp8 import Fp8LinearMethod
        return Fp8LinearMethod(spec)
    from radixlm.layers.quantization.int4 import Int4LinearMethod
    return Int4LinearMethod(spec)
