"""Running the routed experts on a batch: the fused Triton path and the plain PyTorch one.

`fused_experts` is what the MoE layer calls. On CUDA (and under TRITON_INTERPRET=1 when a test
asks for it) it runs the grouped-GEMM kernels of fused_moe_kernel.py; on the CPU
`experts_reference`: a loop over the experts that got tokens, one gate_up and one down matmul
each. The loop is also the floor the benchmark compares against (`radixlm bench moe`) and the
reference the kernel tests check. RADIXLM_DISABLE_FUSED_OPS (the small ops' switch) does not
apply here: the loop reads its expert counts on the host, which a CUDA graph cannot capture.

Weights are stacked per layer: w13 [E, 2I, H] (gate rows then up rows, like a dense
gate_up_proj) and w2 [E, H, I].
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from radixlm.layers.activation import silu_and_mul
from radixlm.layers.kernels import triton_available


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Per-expert loop: for each expert with tokens, gather them, run its MLP, weight and
    scatter-add back. x [T, H] -> [T, H]."""
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
        h = silu_and_mul(F.linear(x[tokens], w13[expert]))
        y = F.linear(h, w2[expert]).float() * flat_w[pairs, None]
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  add: torch.Tensor | None = None, force_triton: bool = False) -> torch.Tensor:
    """The routed experts' weighted sum for every token, plus `add` when given (the shared
    experts' output, summed in the same kernel). x [T, H] -> [T, H].

    `force_triton`: take the kernel path on any device (tests under TRITON_INTERPRET=1)."""
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    if force_triton or (x.is_cuda and triton_available()):
        return _fused_experts_triton(x, w13, w2, topk_weights, topk_ids, add)
    out = experts_reference(x, w13, w2, topk_weights, topk_ids)
    return out if add is None else out + add


def _fused_experts_triton(x, w13, w2, topk_weights, topk_ids, add) -> torch.Tensor:
    from radixlm.layers.moe import fused_moe_kernel as kern
    from radixlm.layers.moe.tile_configs import tile_config_for

    t, top_k = topk_ids.shape
    num_experts, two_i, hidden = w13.shape
    num_pairs = t * top_k
    tile1 = tile_config_for(num_pairs, num_experts, two_i, hidden, x.dtype, x.device)
    tile2 = tile_config_for(num_pairs, num_experts, hidden, two_i // 2, x.dtype, x.device)
    pairs = kern.align_pairs_to_blocks(topk_ids, num_experts, tile1.block_m)
    if tile2.block_m != tile1.block_m:   # both GEMMs walk the same sorted blocks
        tile2 = dataclasses.replace(tile2, block_m=tile1.block_m)
    gate_up = torch.empty((num_pairs, two_i), dtype=x.dtype, device=x.device)
    kern.grouped_gemm(x, w13, gate_up, pairs, top_k, tile1)
    act = silu_and_mul(gate_up)
    down = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)
    kern.grouped_gemm(act, w2, down, pairs, 1, tile2,
                      pair_weights=topk_weights.reshape(-1).to(torch.float32))
    return kern.sum_pairs(down, top_k, add)
