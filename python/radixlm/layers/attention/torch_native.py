"""The reference attention backend: gather each request's K/V by slot index, then SDPA.

It runs on CPU and GPU and is what the project's own kernels are tested against. It loops over
requests in Python, which is fine for a reference and for CPU serving of small models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.core.kv_quant import dequantize
from radixlm.layers.attention.base import AttentionBackend


class TorchNativeAttnBackend(AttentionBackend):
    def init_forward_metadata(self, forward_batch):
        """The rows' draft trees as host pairs (tree_start, mask bits), read once a step."""
        self.metadata = _host_trees(forward_batch)
        return self.metadata

    def forward_extend(self, q, k, v, layer, fb):
        return self._run(q, k, v, layer, fb, causal=True)

    def forward_decode(self, q, k, v, layer, fb):
        return self._run(q, k, v, layer, fb, causal=False)

    def _run(self, q, k, v, layer, fb, causal: bool) -> torch.Tensor:
        hq, hk, d, dv = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.v_head_dim
        self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k.view(-1, hk, d),
                            v.view(-1, hk, dv))
        k_buf, v_buf = self.kv_pool.get_kv(layer.layer_id)
        k_scale, v_scale = self.kv_pool.scales(layer.layer_id)
        q = q.view(-1, hq, d)
        out = q.new_empty((q.shape[0], hq, dv))
        table = self.req_to_token_pool.req_to_token
        trees = None
        if not causal and fb.tree_mask is not None:
            trees = self.metadata if self.metadata is not None else _host_trees(fb)
        start = 0
        for i in range(fb.batch_size):
            n_new = fb.extend_seq_lens_cpu[i]
            seq_len = fb.seq_lens_cpu[i]
            slots = table[fb.req_pool_indices[i], :seq_len].long()
            qi = q[start:start + n_new].transpose(0, 1).unsqueeze(0)            # [1, Hq, n, D]
            # The pool's storage dtype (fp8: scaled) back in the query's dtype.
            ki = dequantize(k_buf[slots], k_scale, q.dtype).transpose(0, 1).unsqueeze(0)
            vi = dequantize(v_buf[slots], v_scale, q.dtype).transpose(0, 1).unsqueeze(0)
            mask = None
            if causal and n_new > 1:
                # New token j sits at absolute position prefix + j and sees keys 0..prefix + j.
                prefix = seq_len - n_new
                rows = torch.arange(n_new, device=q.device).unsqueeze(1) + prefix
                mask = torch.arange(seq_len, device=q.device).unsqueeze(0) <= rows
            elif trees is not None and trees[i][0] < seq_len:
                mask = _tree_row_mask(seq_len, *trees[i], q.device)
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=layer.scaling,
                                                enable_gqa=hq != hk)
            out[start:start + n_new] = oi.squeeze(0).transpose(0, 1)
            start += n_new
        return out.view(-1, hq * dv)


def _tree_row_mask(seq_len: int, tree_start: int, bits: int, device: torch.device
                   ) -> torch.Tensor:
    """[1, seq_len] bool: the keys a draft-tree row sees (ForwardBatch.tree_mask): every key
    before tree_start, and from there those whose bit is set."""
    rel = torch.arange(seq_len, device=device) - tree_start
    in_tree = (torch.tensor(bits, dtype=torch.int64, device=device) >> rel.clamp(min=0)) & 1
    return ((rel < 0) | (in_tree == 1)).unsqueeze(0)


def _host_trees(fb) -> list[tuple[int, int]] | None:
    if fb.tree_mask is None:
        return None
    return list(zip(fb.tree_start.tolist(), fb.tree_mask.tolist()))
