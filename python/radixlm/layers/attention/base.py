"""The attention-backend interface and the registry that picks one by name.

Layers call `backend.forward(q, k, v, layer, forward_batch)`; a backend stores the new K/V in the
pool and attends over each request's whole context (cached prefix + new tokens). Metadata that
depends only on the batch is built once per step in `init_forward_metadata`, not per layer.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.layers.attention.radix_attention import RadixAttention
    from radixlm.core.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Compute per-batch metadata (into forward_batch.attn_metadata)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", forward_batch: "ForwardBatch") -> torch.Tensor:
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

    def init_forward_metadata_capture(self, forward_batch: "ForwardBatch") -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")


# name -> "module:Class", imported only when chosen (a CPU install never imports Triton).
_BACKENDS = {
    "torch_native": "radixlm.layers.attention.torch_native:TorchNativeAttnBackend",
    "triton": "radixlm.layers.attention.triton_backend:TritonAttnBackend",
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def create_attention_backend(name: str, **kwargs) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend: unknown backend {name!r}; "
                         f"choose from {available_backends()}")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)
