"""The attention-backend interface and the registry that picks one by name.

A backend is built once per model runner with the memory it reads and writes: the KV pool
(per-layer K/V tensors) and the req-to-token table (which slots each request's tokens use). It is
handed to every attention layer at build time (`radix_attention.bind_attention_backend`), so a ForwardBatch
carries only the step's inputs.

Per step the runner calls `init_forward_metadata(batch)`, which derives what every layer of the
step shares (kv indices, split layout) once and returns it as the backend's own typed metadata;
per layer, `forward(q, k, v, layer, batch)` stores the new K/V in the pool and attends over each
request's whole context (cached prefix + new tokens).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

import torch

from radixlm.core.forward_batch import ForwardBatch

if TYPE_CHECKING:  # annotations only: the pools live in mem_cache, above this package
    from radixlm.mem_cache.pools import KVPool, ReqToTokenPool


class AttentionLayer(Protocol):
    """What a backend reads of the layer it runs for (RadixAttention provides it)."""

    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    scaling: float


class AttentionBackend(ABC):
    def __init__(self, kv_pool: "KVPool", req_to_token_pool: "ReqToTokenPool"):
        self.kv_pool = kv_pool
        self.req_to_token_pool = req_to_token_pool
        # The metadata of the step being launched; replaced by the next init_forward_metadata
        # (the previous step's kernels are already queued with their own tensors).
        self.metadata: Any = None

    def bind_layers(self, layers: list[AttentionLayer]) -> None:
        """Called once with every attention layer the backend serves (their shapes are not
        known when the backend is built)."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> Any:
        """Per-batch metadata shared by every layer of the step (None when a backend needs none)."""
        self.metadata = None
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: AttentionLayer, forward_batch: ForwardBatch) -> torch.Tensor:
        """q: [T, Hq*D], k/v: [T, Hk*D] -> [T, Hq*D]."""
        if forward_batch.forward_mode.is_decode:
            return self.forward_decode(q, k, v, layer, forward_batch)
        return self.forward_extend(q, k, v, layer, forward_batch)

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch) -> torch.Tensor: ...

    # CUDA graphs (decode only). A backend that supports them computes its decode metadata with
    # device ops whose shapes depend on the batch size alone, so the capture records the metadata
    # computation too and a replay needs nothing but fresh inputs in the graph's static buffers.
    supports_cuda_graph: bool = False

    def init_forward_metadata_capture(self, forward_batch: ForwardBatch) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")


# name -> "module:Class", imported only when chosen (a CPU install never imports Triton).
_BACKENDS = {
    "torch_native": "radixlm.layers.attention.torch_native:TorchNativeAttnBackend",
    "triton": "radixlm.layers.attention.triton_backend:TritonAttnBackend",
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, kv_pool: "KVPool", req_to_token_pool: "ReqToTokenPool",
                             **kwargs) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend: unknown backend {name!r}; "
                         f"choose from {available_backends()}")
    module, cls = _BACKENDS[name].split(":")
    backend_cls = getattr(importlib.import_module(module), cls)
    return backend_cls(kv_pool, req_to_token_pool, **kwargs)
