"""Qwen2-MoE and Qwen3-MoE: the Qwen2 / Qwen3 decoders with sparse MoE blocks.

Routing is softmax top-k, renormalised when `norm_topk_prob`. Which layers are sparse follows
`decoder_sparse_step` and `mlp_only_layers` (ModelConfig.moe_layers); the others keep a dense
MLP. Qwen2-MoE adds one shared expert scaled by sigmoid(shared_expert_gate(x)); Qwen3-MoE has
none.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.core.model_config import ModelConfig
from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.moe.topk import RoutingConfig
from radixlm.models.moe_block import SparseMoeBlock
from radixlm.models.qwen2 import Qwen2ForCausalLM
from radixlm.models.qwen3 import Qwen3ForCausalLM


class _QwenMoeMixin:
    def build_mlp(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        if layer_id not in config.moe_layers:
            return super().build_mlp(config, layer_id, tp)  # type: ignore[misc]
        routing = RoutingConfig(config.num_experts_per_tok, renormalize=config.norm_topk_prob)
        return SparseMoeBlock(config, tp, routing, shared_expert_gate=True)

    def checkpoint_to_param(self, name: str) -> tuple[str, Any]:
        # Qwen2-MoE's one shared expert sits where DeepSeek's shared experts do.
        return super().checkpoint_to_param(  # type: ignore[misc]
            name.replace(".shared_expert.", ".shared_experts."))


class Qwen2MoeForCausalLM(_QwenMoeMixin, Qwen2ForCausalLM):
    @staticmethod
    def attention_biases(config: ModelConfig) -> tuple[bool, bool]:
        """q/k/v biases per `qkv_bias` (default on), never an o_proj bias."""
        return config.qkv_bias is not False, False


class Qwen3MoeForCausalLM(_QwenMoeMixin, Qwen3ForCausalLM):
    pass
