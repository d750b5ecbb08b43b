"""Attention as one opaque op while dynamo traces a model (`--enable-torch-compile`).

torch.compile cannot trace into the attention backends (per-step metadata objects, Triton
launches, KV pool writes). While tracing, RadixAttention calls `radixlm::attention` instead: a
custom op whose real implementation is the layer's backend forward, run with the step's
ForwardBatch from `decode_step`, and whose fake implementation only gives the output's shape.
The layer is found by an integer key (`register_layers`), the only non-tensor argument an op
can carry into a graph.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch

# Attention layers by registry key (the custom op's integer argument), and the decode step
# being traced or run: set by `decode_step` around each compiled call.
# (Weak: a runner that is dropped frees its layers, their backend and its KV pool.)
_LAYERS: "weakref.WeakValueDictionary[int, nn.Module]" = weakref.WeakValueDictionary()
_KEYS_PER_MODEL = 1 << 16
_models_registered = 0
_STEP: list[ForwardBatch] = []


@torch.library.custom_op("radixlm::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  layer_key: int) -> torch.Tensor:
    # (Writes the step's K/V into the KV pool, which no traced tensor aliases: the op is kept
    # in order because its output feeds the rest of the layer.)
    layer = _LAYERS[layer_key]
    return layer.backend.forward(q, k, v, layer, _STEP[-1])


@_attention_op.register_fake
def _attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     layer_key: int) -> torch.Tensor:
    layer = _LAYERS[layer_key]
    return q.new_empty(q.shape[0], layer.num_heads * layer.v_head_dim)


def attention(layer: nn.Module, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> torch.Tensor:
    """RadixAttention's forward while dynamo traces: the opaque op for this layer."""
    return _attention_op(q, k, v, layer.compile_key)


@contextlib.contextmanager
def decode_step(fb: ForwardBatch) -> Iterator[None]:
    """The ForwardBatch the attention op reads during one compiled call."""
    _STEP.append(fb)
    try:
        yield
    finally:
        _STEP.pop()


def register_layers(model: nn.Module) -> int:
    """Give every attention layer of `model` its op key; returns how many. Keys are the same
    from one process to the next (the n-th model registered, its layer index), as they are
    constants in the traced graph and inductor's cache is keyed by the graph."""
    global _models_registered
    layers = [m for m in model.modules() if hasattr(m, "compile_key")]   # RadixAttention
    base = _KEYS_PER_MODEL * _models_registered
    _models_registered += 1
    for layer in layers:
        layer.compile_key = base + layer.layer_id
        _LAYERS[layer.compile_key] = layer
    return len(layers)
