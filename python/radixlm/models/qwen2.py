"""Qwen2: the Llama decoder with biases on the q/k/v projections (none on o_proj)."""

from radixlm.core.model_config import ModelConfig
from radixlm.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_biases(config: ModelConfig) -> tuple[bool, bool]:
        """Qwen2 always has q/k/v biases and never an o_proj bias (its HF config has no
        switch for them)."""
        return True, False
