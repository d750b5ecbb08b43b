"""What the quantized linear methods share: their spec, and the flattening around the matmul
(a layer sees [..., K] inputs; the kernels take [M, K])."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.layers.linear import LinearMethod
from radixlm.layers.quantization.spec import QuantSpec


class QuantizedLinearMethod(LinearMethod):
    def __init__(self, spec: QuantSpec):
        self.spec = spec

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        y = self.matmul(layer, x.reshape(-1, x.shape[-1]), bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def matmul(self, layer: nn.Module, x: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, K] times the layer's weight, plus `bias` when given: [M, N]."""
        raise NotImplementedError

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The processed weight as a [N, K] matrix in `dtype`."""
        raise NotImplementedError
