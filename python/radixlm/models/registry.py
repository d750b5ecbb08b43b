"""HF `architectures` name -> model class, imported lazily."""

from __future__ import annotations

import importlib

from radixlm.core.model_config import ModelConfig

_MODELS = {
    "LlamaForCausalLM": "radixlm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "radixlm.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "radixlm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "radixlm.models.qwen3:Qwen3ForCausalLM",
    "MixtralForCausalLM": "radixlm.models.mixtral:MixtralForCausalLM",
    "Qwen2MoeForCausalLM": "radixlm.models.qwen_moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "radixlm.models.qwen_moe:Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM": "radixlm.models.deepseek_v2:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "radixlm.models.deepseek_v2:DeepseekV3ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_model_class(config: ModelConfig) -> type:
    """The class for the first of the config's `architectures` that has one."""
    for arch in config.architectures:
        if arch in _MODELS:
            module, cls = _MODELS[arch].split(":")
            return getattr(importlib.import_module(module), cls)
    raise ValueError(f"--model-path: unsupported architecture {list(config.architectures)}; "
                     f"supported: {supported_architectures()}")
