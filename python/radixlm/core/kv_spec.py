"""KVCacheSpec: what one token costs in the KV cache, as the model declares it.

The model knows the shape of what its attention layers store per token (standard K and V per
KV head, or one compressed latent for multi-head latent attention); the memory code should size
and shape its pools from this declaration instead of re-deriving it from the config, so that a
new attention kind changes the model and its spec, not the pool-sizing code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

KVKind = Literal["mha", "mla"]


@dataclass(frozen=True)
class KVCacheSpec:
    """Per-token KV storage of one model on one tensor-parallel rank.

    kind "mha": every layer stores K and V, each [num_kv_heads, head_dim] (GQA and MQA are
    "mha" with fewer KV heads). kind "mla": every layer stores one latent vector per token
    (num_kv_heads == 1, head_dim == kv_lora_rank + qk_rope_head_dim) from which K and V are
    recomputed, so there is no separate V.
    """

    kind: KVKind
    num_layers: int
    num_kv_heads: int       # on this rank
    head_dim: int           # K's and V's head dim ("mha"), the latent dim ("mla")
    # "mla": how many of the latent's leading values are V (kv_lora_rank; the rest is the
    # rotated key part). 0 for "mha".
    latent_value_dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("mha", "mla"):
            raise ValueError(f"unknown KV cache kind {self.kind!r}")
        if self.kind == "mla" and self.num_kv_heads != 1:
            raise ValueError("an MLA cache stores one latent per token (num_kv_heads must be 1)")
        if self.kind == "mla" and not 0 < self.latent_value_dim <= self.head_dim:
            raise ValueError("an MLA cache needs latent_value_dim in 1..head_dim")

    @property
    def tensors_per_layer(self) -> int:
        """2 for K and V; 1 for the MLA latent, which serves as both."""
        return 2 if self.kind == "mha" else 1

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes one token takes in the cache over all layers, stored in `dtype`."""
        return (self.tensors_per_layer * self.num_layers * self.num_kv_heads * self.head_dim
                * dtype.itemsize)
