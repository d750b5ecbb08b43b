"""`--attention-backend triton`: the project's own Triton kernels over the token-level KV pool.

Per batch, `init_forward_metadata` flattens the KV slots each request reads from
`req_to_token` into one int32 list (kv_indptr / kv_indices, see kernels/common.py) and, for
decode, picks the split-KV layout; every layer of the step reuses it. Per layer, the backend
stores the new K/V into the pool and launches the kernels:

  decode  kernels/decode_attention.py: split-KV (flash-decoding) with GQA groups per program.
  extend  kernels/extend_attention.py: FlashAttention-style; prefix from the pool, the new tokens'
          own K/V from this step's contiguous k/v tensors.

Over an MLA latent pool (`kv_pool.is_latent`) the kernels are kernels/mla_attention.py's: the
same split-KV decode layout, and an extend kernel that reads every key, the new ones included,
from the pool (its kv_indices then cover each request's whole sequence, not only the prefix).

An fp8 pool (`--kv-cache-dtype fp8_e4m3`) is quantized by the store kernel and read as fp8 by
the decode and extend kernels, which take the layer's k_scale / v_scale (the pool's `scales`) as
plain float arguments: fixed when the pool is built, so a CUDA graph captures them as constants.

forward_decode does no host-device synchronisation: every host-side number it needs (batch size,
the maximum number of splits) was decided in init_forward_metadata from the ForwardBatch's host
lists, and the per-request quantities stay on the device.

CUDA graphs: init_forward_metadata_capture builds the same decode metadata with shapes that depend
on the batch size only (kv_indices sized for every request at the full context length, a fixed
max_kv_splits). It runs inside the capture, so every replay recomputes kv_indptr / kv_indices /
num_kv_splits on the device from the graph's static req_pool_indices and seq_lens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.core.forward_batch import ForwardBatch
from radixlm.layers.attention.base import AttentionBackend, AttentionLayer
from radixlm.layers.attention.kernels import (
    alloc_decode_buffers,
    build_kv_indices,
    choose_max_kv_splits,
    decode_attention,
    extend_attention,
    per_request_kv_splits,
)
from radixlm.layers.attention.kernels.common import num_sms
from radixlm.layers.attention.kernels.decode_attention import (
    MIN_TOKENS_PER_SPLIT,
    SplitKVBuffers,
)
from radixlm.layers.attention.kernels.mla_attention import (
    MLA_MIN_TOKENS_PER_SPLIT,
    mla_decode_attention,
    mla_decode_programs_per_request,
    mla_extend_attention,
)
from radixlm.layers.attention.kernels.store_kv import store_kv, store_rows
from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.mem_cache.pools import KVPool, ReqToTokenPool


@dataclass
class TritonDecodeMetadata:
    batch_size: int
    kv_indptr: torch.Tensor       # [B+1] int32: request i reads kv_indices[kv_indptr[i]:...]
    kv_indices: torch.Tensor      # KV slots of every request's context, flattened
    num_kv_splits: torch.Tensor   # [B] int32: splits per request (split-KV decode)
    max_kv_splits: int
    # Rows verifying a tree of drafts (ForwardBatch.tree_start / tree_mask), or None
    tree_start: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    # Where the split-KV kernel's splits meet, allocated by the first layer and reused by the
    # rest (every layer of a step has the same shapes); keyed by (q heads, head dim).
    buffers: dict[tuple[int, int], SplitKVBuffers] = field(default_factory=dict)


@dataclass
class TritonExtendMetadata:
    qo_indptr: torch.Tensor       # [B+1] int32: request i's new tokens are q[qo_indptr[i]:...]
    kv_indptr: torch.Tensor       # [B+1] int32 over the cached prefixes (MLA: whole sequences)
    kv_indices: torch.Tensor
    max_extend_len: int


class TritonAttnBackend(AttentionBackend):
    def __init__(self, kv_pool: "KVPool", req_to_token_pool: "ReqToTokenPool",
                 decode_block_n: int | None = None, extend_block_m: int | None = None,
                 extend_block_n: int | None = None, extend_tma: bool | None = None):
        super().__init__(kv_pool, req_to_token_pool)
        # Tile overrides exist for tests (small tiles exercise multi-tile paths on tiny inputs;
        # extend_tma=True runs the TMA path under the interpreter); by default the kernels pick
        # tiles from head_dim and dtype, and TMA where `extend_attention.uses_tma` allows.
        self.decode_block_n = decode_block_n
        self.extend_block_m = extend_block_m
        self.extend_block_n = extend_block_n
        self.extend_tma = extend_tma
        # Decode programs per request and split: one per KV head, or for the MLA latent pool
        # one per block of query heads (bind_layers sets it from the layers).
        self.decode_programs_per_request = kv_pool.num_kv_heads
        self.min_tokens_per_split = (MLA_MIN_TOKENS_PER_SPLIT if kv_pool.is_latent
                                     else MIN_TOKENS_PER_SPLIT)
        device = kv_pool.device
        if (kv_pool.is_fp8 and device.type == "cuda"
                and torch.cuda.get_device_capability(device) < (8, 9)):
            # Triton converts float8_e4m3fn on sm_89+ only; say so instead of failing to compile.
            raise ValueError("--kv-cache-dtype fp8_e4m3: the Triton attention kernels need a GPU "
                             "of compute capability 8.9 or newer (Ada, Hopper); use "
                             "--attention-backend torch_native or --kv-cache-dtype auto")

    def bind_layers(self, layers: list[AttentionLayer]) -> None:
        if self.kv_pool.is_latent and layers:
            self.decode_programs_per_request = max(
                mla_decode_programs_per_request(layer.num_heads) for layer in layers)

    # ------------------------------------------------------------------ metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch
                              ) -> TritonDecodeMetadata | TritonExtendMetadata:
        fb = forward_batch
        table = self.req_to_token_pool.req_to_token
        if fb.forward_mode.is_decode:
            return self._init_decode_metadata(fb, sum(fb.seq_lens_cpu),
                                              max(fb.seq_lens_cpu, default=1))

        bs = fb.batch_size
        # The prefix a request's queries see is everything before its new tokens; computed the
        # way the reference backend does (seq_len - extend_len). The MLA kernel reads the new
        # tokens from the pool too, so its list covers the whole sequence.
        if self.kv_pool.is_latent:
            kv_lens = list(fb.seq_lens_cpu)
        else:
            kv_lens = [s - e for s, e in zip(fb.seq_lens_cpu, fb.extend_seq_lens_cpu)]
        qo_indptr = [0]
        for n in fb.extend_seq_lens_cpu:
            qo_indptr.append(qo_indptr[-1] + n)
        # One host-to-device copy for all the small per-request integers.
        packed = to_device(kv_lens + qo_indptr, torch.int32, table.device)
        kv_indptr, kv_indices = build_kv_indices(table, fb.req_pool_indices, packed[:bs],
                                                 sum(kv_lens))
        self.metadata = TritonExtendMetadata(packed[bs:], kv_indptr, kv_indices,
                                             max(fb.extend_seq_lens_cpu, default=0))
        return self.metadata

    supports_cuda_graph = True

    def init_forward_metadata_capture(self, forward_batch: ForwardBatch) -> TritonDecodeMetadata:
        # Sized for every request at the full context length: shapes depend on the batch size
        # alone, so a replay recomputes the rest on the device.
        max_ctx = self.req_to_token_pool.max_context_len
        return self._init_decode_metadata(forward_batch, forward_batch.batch_size * max_ctx,
                                          max_ctx)

    def _init_decode_metadata(self, fb: ForwardBatch, num_kv_indices: int,
                              max_seq_len: int) -> TritonDecodeMetadata:
        """Decode metadata with room for num_kv_indices slots and splits chosen for sequences
        of up to max_seq_len tokens."""
        table = self.req_to_token_pool.req_to_token
        kv_indptr, kv_indices = build_kv_indices(table, fb.req_pool_indices, fb.seq_lens,
                                                 num_kv_indices)
        max_kv_splits = choose_max_kv_splits(fb.batch_size, self.decode_programs_per_request,
                                             max_seq_len, num_sms(table.device),
                                             self.min_tokens_per_split)
        assert fb.tree_mask is None or not self.kv_pool.is_latent, \
            "draft trees over an MLA latent cache (ModelRunner refuses them)"
        self.metadata = TritonDecodeMetadata(
            fb.batch_size, kv_indptr, kv_indices,
            per_request_kv_splits(fb.seq_lens, max_kv_splits, self.min_tokens_per_split),
            max_kv_splits,
            tree_start=fb.tree_start, tree_mask=fb.tree_mask)
        return self.metadata

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       layer: AttentionLayer, forward_batch: ForwardBatch) -> torch.Tensor:
        md = self._metadata(TritonDecodeMetadata)
        hq, d, dv = layer.num_heads, layer.head_dim, layer.v_head_dim
        k_buf, v_buf = self._store_kv(k, v, layer, forward_batch)
        q3 = q.reshape(-1, hq, d)
        out = q3.new_empty((q3.shape[0], hq, dv))
        if (hq, dv) not in md.buffers:
            md.buffers[(hq, dv)] = alloc_decode_buffers(md.batch_size, hq, dv,
                                                        md.max_kv_splits, q.device)
        buffers = md.buffers[(hq, dv)]
        if self.kv_pool.is_latent:
            mla_decode_attention(q3, k_buf, out, dv, md.kv_indptr, md.kv_indices,
                                 md.num_kv_splits, md.max_kv_splits, layer.scaling, buffers,
                                 block_n=self.decode_block_n)
            return out.view(-1, hq * dv)
        k_scale, v_scale = self.kv_pool.scales(layer.layer_id)
        decode_attention(q3, k_buf, v_buf, out, md.kv_indptr, md.kv_indices, md.num_kv_splits,
                         md.max_kv_splits, layer.scaling, buffers, block_n=self.decode_block_n,
                         k_scale=k_scale, v_scale=v_scale, tree_start=md.tree_start,
                         tree_mask=md.tree_mask)
        return out.view(-1, hq * d)

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       layer: AttentionLayer, forward_batch: ForwardBatch) -> torch.Tensor:
        md = self._metadata(TritonExtendMetadata)
        hq, hk, d, dv = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.v_head_dim
        k_buf, v_buf = self._store_kv(k, v, layer, forward_batch)
        q3 = q.reshape(-1, hq, d)
        if self.kv_pool.is_latent:
            out = q3.new_empty((q3.shape[0], hq, dv))
            mla_extend_attention(q3, k_buf, out, dv, md.qo_indptr, md.kv_indptr, md.kv_indices,
                                 md.max_extend_len, layer.scaling, block_m=self.extend_block_m,
                                 block_n=self.extend_block_n)
            return out.view(-1, hq * dv)
        out = torch.empty_like(q3)
        # The kernel reads the new tokens' K/V from these tensors (see extend_attention.py), in
        # the query's dtype so both tl.dot operands agree.
        k3 = k.reshape(-1, hk, d).to(q.dtype)
        v3 = v.reshape(-1, hk, d).to(q.dtype)
        k_scale, v_scale = self.kv_pool.scales(layer.layer_id)
        extend_attention(q3, k3, v3, out, k_buf, v_buf, md.qo_indptr, md.kv_indptr,
                         md.kv_indices, md.max_extend_len, layer.scaling,
                         block_m=self.extend_block_m, block_n=self.extend_block_n,
                         k_scale=k_scale, v_scale=v_scale, tma=self.extend_tma,
                         extend_lens=forward_batch.extend_seq_lens_cpu)
        return out.view(-1, hq * d)

    # ------------------------------------------------------------------ helpers

    def _metadata(self, kind: type):
        if not isinstance(self.metadata, kind):
            raise RuntimeError(f"TritonAttnBackend: a forward pass without init_forward_metadata "
                               f"for this batch (have {type(self.metadata).__name__}, "
                               f"need {kind.__name__})")
        return self.metadata

    def _store_kv(self, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                  fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        # One kernel for K and V (kernels/store_kv.py); no host sync
        # (test_gpu_decode_has_no_host_sync checks it).
        hk, d = layer.num_kv_heads, layer.head_dim
        k_buf, v_buf = self.kv_pool.get_kv(layer.layer_id)
        if self.kv_pool.is_latent:      # one row per token; V is its first v_head_dim values
            store_rows(k.reshape(-1, hk, d), k_buf, fb.out_cache_loc)
            return k_buf, v_buf
        store_kv(k.reshape(-1, hk, d), v.reshape(-1, hk, d), k_buf, v_buf, fb.out_cache_loc,
                 *self.kv_pool.scales(layer.layer_id))
        return k_buf, v_buf
