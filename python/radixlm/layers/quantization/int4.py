"""4-bit weights (W4A16) as a LinearMethod: AWQ and GPTQ checkpoints, or round-to-nearest
quantization of a full-precision checkpoint at load (--quantization w4a16).

Each format is loaded in its own tensor layout, then repacked once into the one layout the
kernels read (int4_kernels.py): `qweight` [K/8, N] int32, `scales` [G, N] fp32, `zeros` [G, N]
uint8, G = ceil(K / group).

    AWQ   qweight [K, N/8] int32, eight outputs per word in the order 0 2 4 6 1 3 5 7;
          qzeros [G, N/8] the same way; scales [G, N].
    GPTQ  qweight [K/8, N] int32, eight inputs per word in order (already ours); qzeros
          [G, N/8], eight outputs per word in order, stored minus one in the v1 format;
          scales [G, N]; g_idx [K] (must be k // group: act-order is refused at startup).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm import envs
from radixlm.layers.linear import WeightLoader, _param, register_bias
from radixlm.layers.quantization.int4_gemv import w4_gemv, w4_gemv_supports
from radixlm.layers.quantization.int4_kernels import (PACK, pack_int4_rows, quantize_int4_rtn,
                                                      unpack_int4_rows, w4_dequantize,
                                                      w4_dequantize_torch, w4a16_gemm)
from radixlm.layers.quantization.method import QuantizedLinearMethod
from radixlm.layers.quantization.split_k import attach_scratch, layer_scratch

# Rows up to which the unpack-in-registers kernel beats dequantize + cuBLAS (bench quant).
W4_KERNEL_MAX_M = 64
# AWQ's nibble i holds output column _AWQ_ORDER[i] of its group of eight.
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_int4_columns(words: torch.Tensor, order: tuple[int, ...] = tuple(range(8))
                        ) -> torch.Tensor:
    """[R, C] int32 words with eight columns each -> [R, 8C] values; nibble i of word c is
    column 8c + order[i]."""
    vals = unpack_int4_rows(words.t().contiguous()).t()          # [R, 8C], nibble order
    r, c8 = vals.shape
    inverse = [order.index(j) for j in range(PACK)]
    return vals.reshape(r, c8 // PACK, PACK)[:, :, inverse].reshape(r, c8)


class Int4LinearMethod(QuantizedLinearMethod):
    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], bias: bool,
                       weight_loader: WeightLoader,
                       bias_loader: WeightLoader | None = None) -> None:
        k, n, spec, g = input_size_per_partition, sum(output_partition_sizes), self.spec, \
            self.spec.group_size
        if k % PACK or n % PACK:
            raise ValueError(f"--quantization {spec.name}: a {k}x{n} layer cannot be stored in "
                             f"4 bits (both sizes must be multiples of {PACK})")
        layer.int4_group = g
        layer.int4_in_features = k
        groups = -(-k // g)
        i32 = torch.int32
        if spec.online:
            layer.register_parameter("weight", _param((n, k), weight_loader))
        elif spec.source == "awq":
            layer.register_parameter("qweight", _param((k, n // PACK), weight_loader, i32,
                                                       input_dim=0, output_dim=1, output_div=PACK))
            layer.register_parameter("qzeros", _param((groups, n // PACK), weight_loader, i32,
                                                      input_dim=0, input_div=g, output_dim=1,
                                                      output_div=PACK))
        else:   # gptq
            layer.register_parameter("qweight", _param((k // PACK, n), weight_loader, i32,
                                                       input_dim=0, input_div=PACK, output_dim=1))
            layer.register_parameter("qzeros", _param((groups, n // PACK), weight_loader, i32,
                                                      input_dim=0, input_div=g, output_dim=1,
                                                      output_div=PACK))
            layer.register_parameter("g_idx", _param((k,), weight_loader, i32, input_dim=0,
                                                     output_dim=None))
        if not spec.online:
            layer.register_parameter("scales", _param((groups, n), weight_loader, torch.float32,
                                                      input_dim=0, input_div=g, output_dim=1))
        register_bias(layer, n, bias, bias_loader or weight_loader)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        spec, g = self.spec, layer.int4_group
        if spec.online:
            qweight, scales, zeros = quantize_int4_rtn(layer.weight.data, g)
            del layer.weight
        else:
            scales = layer.scales.data
            if spec.source == "awq":
                values = unpack_int4_columns(layer.qweight.data, _AWQ_ORDER)      # [K, N]
                qweight = pack_int4_rows(values)
                zeros = unpack_int4_columns(layer.qzeros.data, _AWQ_ORDER)
            else:
                self._check_g_idx(layer)
                qweight = layer.qweight.data
                zeros = unpack_int4_columns(layer.qzeros.data) + spec.gptq_zero_offset
                del layer.g_idx
            zeros = zeros.to(torch.uint8)
            del layer.qzeros
        layer.qweight = nn.Parameter(qweight.contiguous(), requires_grad=False)
        layer.scales = nn.Parameter(scales.contiguous(), requires_grad=False)
        layer.zeros = nn.Parameter(zeros.contiguous(), requires_grad=False)
        attach_scratch(layer, qweight.shape[1], qweight.device)   # split-K buffers

    @staticmethod
    def _check_g_idx(layer: nn.Module) -> None:
        k, g = layer.int4_in_features, layer.int4_group
        # Checkpoints without act-order store zeros or k // group (from this shard's first
        # group under tensor parallelism); both mean "in order".
        g_idx = layer.g_idx.data
        expected = torch.arange(k, device=g_idx.device, dtype=g_idx.dtype) // g + g_idx[0]
        if not (torch.equal(g_idx, expected) or not g_idx.any()):
            raise ValueError("--quantization gptq: this checkpoint's g_idx reorders the inputs "
                             "(act-order); not supported")

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The weight [N, K] this layer computes with (tests and the CPU path)."""
        return w4_dequantize_torch(layer.qweight, layer.scales, layer.zeros, layer.int4_group,
                                   layer.int4_in_features, dtype).t()

    def matmul(self, layer: nn.Module, x: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
        g, k = layer.int4_group, layer.int4_in_features
        if x.device.type != "cuda":
            # No 4-bit kernels on the CPU: widen the weight for this product only.
            return F.linear(x, self.dequantized_weight(layer, x.dtype), bias)
        scratch = layer_scratch(layer, layer.qweight.shape[1], x.device)
        if x.shape[0] == 1 and w4_gemv_supports(g) and not envs.disable_quant_gemv():
            return w4_gemv(x, layer.qweight, layer.scales, layer.zeros, g, scratch, bias)
        if x.shape[0] > W4_KERNEL_MAX_M:
            w = w4_dequantize(layer.qweight, layer.scales, layer.zeros, g, k, x.dtype)
            y = torch.matmul(x, w)
        else:
            y = w4a16_gemm(x, layer.qweight, layer.scales, layer.zeros, g, scratch=scratch)
        return y if bias is None else y + bias
