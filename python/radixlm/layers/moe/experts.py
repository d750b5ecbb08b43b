"""Running the routed experts on a batch: the fused Triton path and the plain PyTorch one.

`fused_experts` is what the MoE layer calls. On CUDA (and under TRITON_INTERPRET=1 when a test
asks for it) it runs the grouped-GEMM kernels of fused_moe_kernel.py; on the CPU
`experts_reference`: a loop over the experts that got tokens, one gate_up and one down matmul
each. The loop is also the floor the benchmark compares against (`radixlm bench moe`) and the
reference the kernel tests check. RADIXLM_DISABLE_FUSED_OPS (the small ops' switch) does not
apply here: the loop reads its expert counts on the host, which a CUDA graph cannot capture.

Weights are stacked per layer: w13 [E, 2I, H] (gate rows then up rows, like a dense
gate_up_proj) and w2 [E, H, I]; in the model's dtype, or FP8 with `Fp8ExpertScales` (the
kernels widen each FP8 tile in registers; the loop dequantizes one expert at a time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import radixlm.envs as envs
from radixlm.layers.activation import silu_and_mul
from radixlm.layers.kernels import triton_available


@dataclass(frozen=True)
class Fp8ExpertScales:
    """The scales of FP8 expert weights: w13 / w2 stand for weight * scale, with one scale per
    (expert, output row), [E, N], or with `block` (bn, bk), one per (expert, bn x bk block),
    [E, ceil(N/bn), ceil(K/bk)]."""

    w13: torch.Tensor
    w2: torch.Tensor
    block: tuple[int, int] | None = None

    def dequantize(self, w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
                   ) -> torch.Tensor:
        """One expert's FP8 matrix [N, K] (with its scale) in `dtype`."""
        from radixlm.layers.quantization.fp8_kernels import dequantize_fp8  # imports triton
        return dequantize_fp8(w, scale, self.block, dtype)


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      scales: Fp8ExpertScales | None = None) -> torch.Tensor:
    """Per-expert loop: for each expert with tokens, gather them, run its MLP, weight and
    scatter-add back. x [T, H] -> [T, H]. With `scales`, each expert's FP8 weights are
    widened to x's dtype for its two matmuls."""
    out = torch.zeros_like(x, dtype=torch.float32)
    flat_ids = topk_ids.reshape(-1).long()
    token_of_pair = torch.arange(x.shape[0], device=x.device).repeat_interleave(
        topk_ids.shape[1])
    flat_w = topk_weights.reshape(-1).float()
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start:start + n]
        start += n
        tokens = token_of_pair[pairs]
        up, down = w13[expert], w2[expert]
        if scales is not None:
            up = scales.dequantize(up, scales.w13[expert], x.dtype)
            down = scales.dequantize(down, scales.w2[expert], x.dtype)
        h = silu_and_mul(F.linear(x[tokens], up))
        y = F.linear(h, down).float() * flat_w[pairs, None]
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  add: torch.Tensor | None = None, force_triton: bool = False,
                  scales: Fp8ExpertScales | None = None,
                  pair_gemv: bool | None = None,
                  fp8_activations: bool | None = None) -> torch.Tensor:
    """The routed experts' weighted sum for every token, plus `add` when given (the shared
    experts' output, summed in the same kernel). x [T, H] -> [T, H]. `scales`: the expert
    weights are FP8 (Fp8ExpertScales).

    Kernel paths: a few tokens run one GEMV per (token, expert) pair (pair_gemv.py), more
    the grouped GEMM (fused_moe_kernel.py); `pair_gemv` forces one or the other (benchmarks,
    tests). With FP8 experts and many rows per expert (prefill), the grouped GEMM also
    quantizes its inputs to FP8, one scale per 128 inputs of a row, and multiplies FP8 by FP8
    (`fp8_activations` forces it on or off). `force_triton`: take a kernel path on any device
    (tests under TRITON_INTERPRET=1)."""
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    if force_triton or (x.is_cuda and triton_available()):
        from radixlm.layers.moe.pair_gemv import use_pair_gemv
        t, top_k = topk_ids.shape
        if pair_gemv is None:
            pair_gemv = use_pair_gemv(t, t * top_k, w13.shape[0], w2.shape[2],
                                      scales is not None)
        if pair_gemv:
            return _pair_gemvs(x, w13, w2, topk_weights, topk_ids, add, scales)
        if fp8_activations is None:
            fp8_activations = takes_fp8_inputs(t * top_k, w13.shape[0])
        fp8_activations = fp8_activations and scales is not None   # W8A8 needs FP8 weights
        return _grouped_gemms(x, w13, w2, topk_weights, topk_ids, add, scales,
                              fp8_activations)
    out = experts_reference(x, w13, w2, topk_weights, topk_ids, scales)
    return out if add is None else out + add


def _pair_gemvs(x, w13, w2, topk_weights, topk_ids, add,
                scales: Fp8ExpertScales | None) -> torch.Tensor:
    """Few tokens: two per-pair GEMVs (SiLU-and-mul inside the second), then the pair sum."""
    from radixlm.layers.moe.fused_moe_kernel import sum_pairs
    from radixlm.layers.moe.pair_gemv import pair_gemv

    top_k = topk_ids.shape[1]
    num_pairs, hidden, two_i = topk_ids.numel(), w13.shape[2], w13.shape[1]
    ids = topk_ids.reshape(-1)
    block = scales.block if scales is not None else None
    gate_up = torch.empty((num_pairs, two_i), dtype=x.dtype, device=x.device)
    pair_gemv(x, w13, gate_up, ids, top_k,
              b_scale=scales.w13 if scales is not None else None, scale_block=block)
    down = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)
    pair_gemv(gate_up, w2, down, ids, 1, gated=True,
              pair_weights=topk_weights.reshape(-1).to(torch.float32),
              b_scale=scales.w2 if scales is not None else None, scale_block=block,
              num_tokens=x.shape[0])
    return sum_pairs(down, top_k, add)


def _grouped_gemms(x, w13, w2, topk_weights, topk_ids, add,
                   scales: Fp8ExpertScales | None, fp8_activations: bool) -> torch.Tensor:
    from radixlm.layers.moe import fused_moe_kernel as kern
    from radixlm.layers.moe.tile_configs import tile_config_for

    t, top_k = topk_ids.shape
    num_experts, two_i, hidden = w13.shape
    num_pairs = t * top_k
    fp8 = scales is not None
    if fp8_activations and num_pairs >= W8A8_LARGE_ROWS_PER_EXPERT * num_experts:
        tile1 = tile2 = kern.MoETileConfig(**W8A8_LARGE_TILE)
    else:
        tile1 = tile_config_for(num_pairs, num_experts, two_i, hidden, x.dtype, x.device, fp8)
        tile2 = tile_config_for(num_pairs, num_experts, hidden, two_i // 2, x.dtype, x.device,
                                fp8)
    pairs = kern.align_pairs_to_blocks(topk_ids, num_experts, tile1.block_m)
    if tile2.block_m != tile1.block_m:   # both GEMMs walk the same sorted blocks
        tile2 = dataclasses.replace(tile2, block_m=tile1.block_m)
    gate_up = torch.empty((num_pairs, two_i), dtype=x.dtype, device=x.device)
    block = scales.block if scales is not None else None
    _grouped_gemm(x, w13, gate_up, pairs, top_k, tile1, fp8_activations,
                  b_scale=scales.w13 if scales is not None else None, scale_block=block)
    act = silu_and_mul(gate_up)
    down = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)
    _grouped_gemm(act, w2, down, pairs, 1, tile2, fp8_activations,
                  pair_weights=topk_weights.reshape(-1).to(torch.float32),
                  b_scale=scales.w2 if scales is not None else None, scale_block=block)
    return kern.sum_pairs(down, top_k, add)


# FP8 experts take FP8 inputs from this many (token, expert) pairs per expert on. bench moe
# --parts kernel (H200): W8A8 ahead of the weight-only tiles by 1.1-1.4x at every batch from 64
# tokens (4-16 rows per expert) to 4096 on Qwen3-30B-A3B, DeepSeek-V2-Lite and Mixtral shapes.
W8A8_MIN_ROWS_PER_EXPERT = 4
ACTIVATION_GROUP = 128
# Prefill-sized W8A8 batches: the files tuned up to 256 tokens pick small tiles; at 1024 and
# 4096 tokens (64+ rows per expert) this tile was best or within 3% for both GEMMs of the
# Qwen3-30B-A3B, DeepSeek-V2-Lite and Mixtral shapes (bench moe --parts w8a8-sweep, H200).
W8A8_LARGE_ROWS_PER_EXPERT = 64
W8A8_LARGE_TILE = dict(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4,
                       num_stages=4)


def takes_fp8_inputs(num_pairs: int, num_experts: int) -> bool:
    """Whether FP8 experts' grouped GEMMs quantize their inputs (W8A8) at this size."""
    return (num_pairs >= W8A8_MIN_ROWS_PER_EXPERT * num_experts
            and not envs.disable_moe_fp8_activations())


def _grouped_gemm(a, b, out, pairs, a_rows_per_pair, tile, fp8_input: bool, **kwargs):
    """fused_moe_kernel.grouped_gemm, on `a` quantized to FP8 first when `fp8_input`."""
    from radixlm.layers.moe import fused_moe_kernel as kern
    if fp8_input:
        from radixlm.layers.quantization.fp8_kernels import quantize_per_token_group
        a, a_scale = quantize_per_token_group(a, ACTIVATION_GROUP)
        kwargs.update(a_scale=a_scale, a_group=ACTIVATION_GROUP)
    return kern.grouped_gemm(a, b, out, pairs, a_rows_per_pair, tile, **kwargs)
