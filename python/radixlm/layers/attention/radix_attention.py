"""The attention layer the models use: it knows its shapes and delegates to the batch's backend."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 scaling: float):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                forward_batch: ForwardBatch) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)
