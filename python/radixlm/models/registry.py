"""HF `architectures` name -> model class, imported lazily."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": "radixlm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "radixlm.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "radixlm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "radixlm.models.qwen3:Qwen3ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_model_class(config) -> type:
    for arch in getattr(config, "architectures", None) or []:
        if arch in _MODELS:
            module, cls = _MODELS[arch].split(":")
            return getattr(importlib.import_module(module), cls)
    raise ValueError(f"--model-path: unsupported architecture {config.architectures}; "
                     f"supported: {supported_architectures()}")
