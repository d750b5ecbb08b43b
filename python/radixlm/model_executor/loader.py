"""Builds a model on its device and fills its weights (checkpoint or random 'dummy' weights)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.model_executor.model_config import ModelConfig
from radixlm.model_executor.weight_source import iter_safetensors_weights
from radixlm.models.registry import resolve_model_class


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_model(model_config: ModelConfig, hf_dir: str, load_format: str, device: torch.device,
               dtype: torch.dtype, seed: int = 0, tp: TPGroup = SINGLE) -> nn.Module:
    """`tp`: this rank's group; each rank builds and loads only its shards."""
    q = model_config.quantization
    if q is not None and load_format != "dummy":
        # Its tensors (FP8 / INT4 with scales) would be copied into full-precision parameters
        # or fail on the first scale tensor; say so up front instead.
        raise ValueError(f"--model-path: quantized checkpoints are not supported yet "
                         f"(quantization_config quant_method "
                         f"{q.get('quant_method', '?')!r}); use a bf16/fp16 checkpoint")
    cls = resolve_model_class(model_config)
    # Parameters are created directly on the device in the compute dtype (an 8B model must not
    # pass through float32 CPU memory first). The model sizes its rotary table from
    # model_config.context_len.
    with _default_dtype(dtype), torch.device(device):
        model = cls(model_config, tp)
    if load_format == "dummy":
        _init_dummy(model, seed)
    else:
        model.load_weights(iter_safetensors_weights(hf_dir))
    return model.eval()


def _init_dummy(model: nn.Module, seed: int) -> None:
    """Small uniform weights: the forward pass costs what the real model costs, and activations
    stay finite in half precision (the text is random, benchmarks set ignore_eos)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.uniform_(-1e-3, 1e-3)
