"""Layers kept in full precision in a quantized model, whatever their checkpoint stores.

MLA's kv_b_proj is never multiplied through its linear method: its weight is split into the
per-head matrices the absorbed attention multiplies with `torch.bmm` (models/deepseek_v2.py).
In an FP8 checkpoint (DeepSeek-V3) it is stored in FP8 with block scales, so it must load as
FP8 and then be widened once; under `--quantization fp8` it is simply not quantized.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.linear import UNQUANTIZED, LinearMethod, WeightLoader
from radixlm.layers.quantization.method import QuantizedLinearMethod


class FullPrecisionAfterLoading(LinearMethod):
    """Creates and loads the parameters `inner` would (so the checkpoint's tensors fit), and
    leaves `layer.weight` in the compute dtype after loading."""

    def __init__(self, inner: QuantizedLinearMethod):
        self.inner = inner

    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], bias: bool,
                       weight_loader: WeightLoader,
                       bias_loader: WeightLoader | None = None) -> None:
        layer.full_precision_dtype = torch.get_default_dtype()
        self.inner.create_weights(layer, input_size_per_partition, output_partition_sizes,
                                  bias, weight_loader, bias_loader)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.inner.spec.online:          # the checkpoint's weight, left as it is
            return
        self.inner.process_weights_after_loading(layer)
        weight = self.inner.dequantized_weight(layer, layer.full_precision_dtype)
        for name in [n for n, _ in layer.named_parameters(recurse=False) if n != "bias"]:
            delattr(layer, name)
        layer.weight = nn.Parameter(weight, requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


def full_precision(method: LinearMethod) -> LinearMethod:
    """The method for a layer that must end in full precision in a model built with `method`."""
    if isinstance(method, QuantizedLinearMethod):
        if method.spec.method != "fp8":
            raise ValueError(f"--quantization: {method.spec.name} is not supported for this "
                             f"model (a layer read as a matrix cannot be 4-bit)")
        return FullPrecisionAfterLoading(method)
    return method if method is not None else UNQUANTIZED
