"""Qwen2: the Llama decoder with biases on the q/k/v projections (none on o_proj)."""

from radixlm.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_biases(config) -> tuple[bool, bool]:
        return True, False
