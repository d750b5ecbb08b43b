"""FP8 weights as a LinearMethod (layers/linear.py): made at load from a full-precision
checkpoint, or loaded from an FP8 one.

After loading every layer holds `weight` [N, K] float8_e4m3fn and `weight_scale` in fp32: [N]
(one per output channel: online quantization, and per-tensor checkpoints, whose scale of each
fused part is repeated over its rows, exactly) or [ceil(N/bn), ceil(K/bk)] (block scales).
`apply` picks the kernel by the number of rows (fp8_kernels.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm import envs
from radixlm.layers.linear import WeightLoader, _param, register_bias
from radixlm.layers.quantization.fp8_kernels import (FP8_DTYPE, dequantize_fp8,
                                                     fp8_weight_gemm, quantize_fp8_per_channel,
                                                     scaled_mm_per_token)
from radixlm.layers.quantization.method import QuantizedLinearMethod
from radixlm.layers.quantization.fp8_gemv import GEMV_MAX_M, fp8_gemv, gated_tiles
from radixlm.layers.quantization.split_k import attach_scratch, layer_scratch

# Rows up to which the weight-only kernel beats FP8 tensor-core GEMMs (bench quant, H200).
FP8_WEIGHT_ONLY_MAX_M = 16


class Fp8LinearMethod(QuantizedLinearMethod):
    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], bias: bool,
                       weight_loader: WeightLoader,
                       bias_loader: WeightLoader | None = None) -> None:
        k, n, spec = input_size_per_partition, sum(output_partition_sizes), self.spec
        parts = len(output_partition_sizes)
        layer.fp8_block = spec.fp8_block
        layer.fp8_parts = list(output_partition_sizes)
        # Online: the checkpoint's full-precision weight, quantized once loaded.
        weight_dtype = None if spec.online else FP8_DTYPE
        layer.register_parameter("weight", _param((n, k), weight_loader, weight_dtype))
        if not spec.online:
            f32 = torch.float32
            if spec.fp8_scales == "tensor":
                scale = _param((parts,), weight_loader, f32, per_part=True)
            elif spec.fp8_scales == "channel":
                scale = _param((n, 1), weight_loader, f32, input_dim=None)
            else:
                bn, bk = spec.fp8_block  # type: ignore[misc]
                scale = _param((-(-n // bn), -(-k // bk)), weight_loader, f32,
                               output_div=bn, input_div=bk)
            # HF's FP8 block checkpoints call the (multiplying) block scale weight_scale_inv.
            block_name = spec.source == "fp8" and spec.fp8_scales == "block"
            layer.register_parameter("weight_scale_inv" if block_name else "weight_scale", scale)
            if spec.static_input_scales:
                # Static activation scales are read and not used: activations are scaled per
                # token at run time, which is at least as accurate.
                layer.register_parameter("input_scale",
                                         _param((parts,), weight_loader, f32, per_part=True))
        register_bias(layer, n, bias, bias_loader or weight_loader)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        spec = self.spec
        w = layer.weight.data
        if spec.online:
            q, scale = quantize_fp8_per_channel(w)
        else:
            q = w
            raw = getattr(layer, "weight_scale_inv", None)
            if raw is None:
                raw = layer.weight_scale
            raw = raw.data.float()
            if spec.fp8_scales == "tensor":
                sizes = torch.tensor(layer.fp8_parts, device=raw.device)
                scale = raw.repeat_interleave(sizes)
            elif spec.fp8_scales == "channel":
                scale = raw.reshape(-1)
            else:
                scale = raw.contiguous()
        for name in ("weight_scale_inv", "input_scale"):
            if hasattr(layer, name):
                delattr(layer, name)
        layer.weight = nn.Parameter(q.contiguous(), requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        n, k = q.shape
        # cuBLASLt's FP8 GEMM wants both dimensions in multiples of 16.
        layer.fp8_scaled_mm_ok = spec.fp8_block is None and n % 16 == 0 and k % 16 == 0
        attach_scratch(layer, n, q.device)      # the small-batch kernels' split-K buffers

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The processed FP8 weight widened to `dtype` [N, K] (layers kept in full precision,
        quantization/full_precision.py)."""
        return dequantize_fp8(layer.weight, layer.weight_scale, layer.fp8_block, dtype)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        # At batch 1 the one-row kernel stores silu(gate) * up itself, as the bf16 GEMV does:
        # one launch a layer fewer.
        x2 = x.reshape(-1, x.shape[-1])
        if (x.device.type != "cuda" or x2.shape[0] > GEMV_MAX_M
                or envs.disable_quant_gemv()):
            return None
        w, scale, block = layer.weight, layer.weight_scale, layer.fp8_block
        tiles = gated_tiles(w.shape[0] // 2, w.shape[1], block)
        if tiles is None:
            return None
        y = fp8_gemv(x2, w, scale, block, tiles=tiles, gated=True)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def matmul(self, layer: nn.Module, x: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
        w, scale, block = layer.weight, layer.weight_scale, layer.fp8_block
        if x.device.type != "cuda":
            # No FP8 kernels on the CPU: widen the FP8 weight for this product only.
            return F.linear(x, dequantize_fp8(w, scale, block, x.dtype), bias)
        if x.shape[0] <= GEMV_MAX_M and not envs.disable_quant_gemv():
            return fp8_gemv(x, w, scale, block, bias)
        if x.shape[0] > FP8_WEIGHT_ONLY_MAX_M and layer.fp8_scaled_mm_ok:
            return scaled_mm_per_token(x, w, scale, bias)
        scratch = layer_scratch(layer, w.shape[0], x.device)
        y = fp8_weight_gemm(x, w, scale, block, scratch=scratch)
        return y if bias is None else y + bias
