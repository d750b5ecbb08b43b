"""The attention layer the models use: it knows its shapes and delegates to its backend.

The backend is not known when the model is built from its config; the model runner binds it
right after loading (`bind_attention_backend`), before any forward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch
from radixlm.layers.attention import traced
from radixlm.layers.attention.base import AttentionBackend


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 scaling: float, v_head_dim: int | None = None):
        """`head_dim` is q's and k's; `v_head_dim` V's (and the output's) when it differs: MLA
        attends with [latent | rope] keys and returns latent-sized outputs."""
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.scaling = scaling
        self.backend: AttentionBackend | None = None
        self.compile_key: int | None = None     # set by traced.register_layers

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                forward_batch: ForwardBatch | None) -> torch.Tensor:
        """q [T, Hq*D], k [T, Hk*D], v [T, Hk*Dv] -> [T, Hq*Dv]."""
        if self.backend is None:
            raise RuntimeError("RadixAttention: no attention backend bound "
                               "(call bind_attention_backend after building the model)")
        if torch.compiler.is_compiling():   # --enable-torch-compile: one opaque op (traced.py)
            return traced.attention(self, q, k, v)
        return self.backend.forward(q, k, v, self, forward_batch)


def bind_attention_backend(model: nn.Module, backend: AttentionBackend) -> int:
    """Hand `backend` to every attention layer of `model`; returns how many layers took it."""
    layers = [m for m in model.modules() if isinstance(m, RadixAttention)]
    for layer in layers:
        layer.backend = backend
    backend.bind_layers(layers)
    return len(layers)
