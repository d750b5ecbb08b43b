"""Mixtral: the Llama decoder with a sparse MoE block (softmax top-k, renormalised) in every
layer. Checkpoints call the block `block_sparse_moe` and the expert matrices w1/w3/w2."""

from __future__ import annotations

from typing import Any

from torch import nn

from radixlm.core.model_config import ModelConfig
from radixlm.distributed.parallel_state import TPGroup
from radixlm.layers.moe.topk import RoutingConfig
from radixlm.models.llama import LlamaForCausalLM
from radixlm.models.moe_block import SparseMoeBlock


class MixtralForCausalLM(LlamaForCausalLM):
    def build_mlp(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        return SparseMoeBlock(config, tp, RoutingConfig(config.num_experts_per_tok,
                                                        renormalize=True))

    def checkpoint_to_param(self, name: str) -> tuple[str, Any]:
        return super().checkpoint_to_param(name.replace(".block_sparse_moe.", ".mlp."))
