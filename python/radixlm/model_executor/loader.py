"""Builds a model on its device and fills its weights (checkpoint or random 'dummy' weights)."""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch
from torch import nn

from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.linear import default_linear_method
from radixlm.layers.quantization import linear_method_for, resolve_quant_spec
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
               dtype: torch.dtype, seed: int = 0, tp: TPGroup = SINGLE,
               quantization: str | None = None) -> nn.Module:
    """`tp`: this rank's group; each rank builds and loads only its shards. `quantization`:
    --quantization, read with the checkpoint's quantization_config (layers/quantization/)."""
    spec = resolve_quant_spec(quantization, model_config.quantization,
                              model_config.architecture, model_config.is_moe, device)
    cls = resolve_model_class(model_config)
    # Parameters are created directly on the device in the compute dtype (an 8B model must not
    # pass through float32 CPU memory first); quantized formats create theirs in their own
    # dtypes. The model sizes its rotary table from model_config.context_len.
    with _default_dtype(dtype), torch.device(device), \
            default_linear_method(linear_method_for(spec)):
        model = cls(model_config, tp)
    if load_format == "dummy":
        _init_dummy(model, seed)
    else:
        weights = iter_safetensors_weights(hf_dir)
        if spec is not None and spec.unconverted_patterns:
            weights = _refuse_quantized_but_unconverted(model, spec.unconverted_patterns,
                                                        weights)
        model.load_weights(weights)
    # Layouts that differ from the checkpoint's are made once here (DeepSeek's rope rows,
    # quantized weights repacked or quantized).
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None:
            hook()
    return model.eval()


def _refuse_quantized_but_unconverted(model: nn.Module, patterns: tuple[str, ...],
                                      weights: Iterator[tuple[str, torch.Tensor]]
                                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass the checkpoint's tensors through, refusing one whose module a `re:` ignore entry
    names (the checkpoint keeps it in full precision) where this model holds it quantized:
    a per-layer method is not supported. Routers, norms and the like match harmlessly."""
    params = dict(model.named_parameters())
    compiled = [re.compile(p) for p in patterns]
    for name, tensor in weights:
        if name.endswith(".weight"):
            module = name.removesuffix(".weight")
            hit = next((p for p in compiled if p.match(module)), None)
            ours, _ = (model.checkpoint_to_param(name.removeprefix("model."))
                       if hit is not None else (None, None))
            if ours is not None:        # (None: a tensor the model does not serve)
                held = params.get(ours)
                if held is None or held.element_size() < tensor.element_size():
                    raise ValueError(
                        f"--quantization: the checkpoint leaves {module} unquantized (ignore "
                        f"entry 're:{hit.pattern}'), and this model quantizes that layer; "
                        f"checkpoints with some linear layers unquantized are not supported "
                        f"yet")
        yield name, tensor


def _init_dummy(model: nn.Module, seed: int) -> None:
    """Small uniform weights: the forward pass costs what the real model costs, and activations
    stay finite in half precision (the text is random, benchmarks set ignore_eos)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dtype.is_floating_point and p.element_size() > 1:
                p.uniform_(-1e-3, 1e-3)
            elif p.dtype.is_floating_point:          # FP8 weights of an FP8 checkpoint
                p.copy_(torch.empty(p.shape, device=p.device).uniform_(-1.0, 1.0))
            else:                                    # packed 4-bit words and indices
                p.copy_(_dummy_ints(name, p))


def _dummy_ints(name: str, p: torch.Tensor) -> torch.Tensor:
    """Integer parameters of a quantized checkpoint for --load-format dummy: random packed
    words, except indices that must be in order (GPTQ's g_idx, all in group 0 is valid)."""
    if name.endswith("g_idx"):
        return torch.zeros_like(p)
    info = torch.iinfo(p.dtype)
    return torch.randint(info.min, info.max, p.shape, dtype=p.dtype, device=p.device)
