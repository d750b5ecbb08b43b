"""The sparse MoE block that replaces the dense MLP in Mixtral, Qwen2/3-MoE and DeepSeek layers.

    gate (router)  -> select_experts -> FusedMoE (routed experts, stacked weights)
    + shared experts (DeepSeek; Qwen2-MoE's one shared expert, scaled by sigmoid(its gate))
    -> one all-reduce of the sum under tensor parallelism

Checkpoint names, after the model's renames: `mlp.gate.weight` (and DeepSeek-V3's
`mlp.gate.e_score_correction_bias`), `mlp.experts.<e>.*`, `mlp.shared_experts.*`,
`mlp.shared_expert_gate.weight`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.core.model_config import ModelConfig
from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.kernels import takes_one_row_gemv
from radixlm.layers.linear import current_linear_method
from radixlm.layers.moe.build import build_experts
from radixlm.layers.moe.topk import RoutingConfig, select_experts
from radixlm.models.llama import LlamaMLP


class MoEGate(nn.Module):
    """Router logits (replicated on every rank) and DeepSeek-V3's load-balancing bias.
    `fp32`: weight and product in float32 (DeepSeek), else in the model's dtype."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool = False,
                 fp32: bool = False):
        super().__init__()
        dtype = torch.float32 if fp32 else None
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype),
                                   requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)
            if correction_bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if takes_one_row_gemv(x):
            from radixlm.layers.kernels import gemv_kernels
            tiles = gemv_kernels.router_tiles(x, self.weight)
            if tiles is not None:   # a float32 router widens x itself
                return gemv_kernels.gemv(x, self.weight, None, tiles)
        return F.linear(x.to(self.weight.dtype), self.weight)


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, routing: RoutingConfig,
                 shared_expert_gate: bool = False, correction_bias: bool = False,
                 fp32_router: bool = False):
        super().__init__()
        routing.check(config.num_experts)
        self.tp = tp
        self.routing = routing
        self.gate = MoEGate(config.hidden_size, config.num_experts, correction_bias,
                            fp32_router)
        # FP8 experts when the model is served quantized (the router's gate never is).
        self.experts = build_experts(config.num_experts, config.hidden_size,
                                     config.moe_intermediate_size, tp,
                                     getattr(current_linear_method(), "spec", None))
        shared = config.shared_expert_intermediate_size
        self.shared_experts = (LlamaMLP(config.hidden_size, shared, False, tp,
                                        reduce_results=False) if shared else None)
        self.shared_expert_gate = (MoEGate(config.hidden_size, 1)
                                   if shared and shared_expert_gate else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.routing,
                                      self.gate.e_score_correction_bias)
        shared = None
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return self.tp.all_reduce(self.experts(x, weights, ids, add=shared))
