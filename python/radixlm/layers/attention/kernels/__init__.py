"""The project's own Triton attention kernels (decode: split-KV; extend: FlashAttention-style).

Importing this package imports Triton, so only the Triton backend imports it.
"""

from radixlm.layers.attention.kernels.common import build_kv_indices
from radixlm.layers.attention.kernels.decode_attention import (
    alloc_decode_buffers,
    choose_max_kv_splits,
    decode_attention,
    per_request_kv_splits,
)
from radixlm.layers.attention.kernels.extend_attention import extend_attention

__all__ = [
    "alloc_decode_buffers",
    "build_kv_indices",
    "choose_max_kv_splits",
    "decode_attention",
    "extend_attention",
    "per_request_kv_splits",
]
