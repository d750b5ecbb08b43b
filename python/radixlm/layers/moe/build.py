"""The routed experts a MoE layer gets, by the quantization the model is served with."""

from __future__ import annotations

from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.moe.layer import FusedMoE
from radixlm.layers.quantization.spec import QuantSpec


def build_experts(num_experts: int, hidden_size: int, intermediate_size: int, tp: TPGroup,
                  quant: QuantSpec | None) -> FusedMoE:
    """Experts in the model's dtype, or FP8 experts; 4-bit experts are refused (the flag
    checks refuse them first, layers/quantization/spec.py)."""
    if quant is None:
        return FusedMoE(num_experts, hidden_size, intermediate_size, tp)
    if quant.method != "fp8":
        raise ValueError(f"--quantization: {quant.name} is not supported yet for the experts "
                         f"of mixture-of-experts models (fp8 is)")
    from radixlm.layers.moe.fp8_experts import Fp8Experts   # imports triton
    return Fp8Experts(num_experts, hidden_size, intermediate_size, tp, quant)
