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
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=layer.scaling,
                                                enable_gqa=hq != hk)
            out[start:start + n_new] = oi.squeeze(0).transpose(0, 1)
            start += n_new
        return out.view(-1, hq * dv)
