"""Re-export: ModelConfig and resolve_dtype live in radixlm.core.model_config, below models/,
so that models can take a ModelConfig without importing model_executor/. Callers that import
them from here (model_runner.py, scripts) keep working."""

from radixlm.core.model_config import ModelConfig, RopeScaling, resolve_dtype

__all__ = ["ModelConfig", "RopeScaling", "resolve_dtype"]
