"""The floor: the same model's forward in plain PyTorch, with no engine.

cuBLAS matmuls (F.linear on the engine's own weights) and `scaled_dot_product_attention` over
contiguous per-layer K/V tensors: what a hand-written static-batch loop costs. One-batch reports
engine time / floor time measured in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.bench.common import sync_device


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
    return (norm.weight.float() * xf).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, L, D]; cos/sin: [L, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class FloorModel:
    """Static-batch prefill and decode over the engine model's weights."""

    def __init__(self, model):
        self.m = model

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
        """ids [B, L] -> (last-token logits [B, V], per-layer (k, v) caches [B, Hk, L, D])."""
        return self._forward(ids, start=0, caches=None)

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, start: int, caches: list) -> torch.Tensor:
        """ids [B, 1] at position `start`; caches are preallocated and written in place."""
        logits, _ = self._forward(ids, start=start, caches=caches)
        return logits

    def _forward(self, ids: torch.Tensor, start: int, caches: list | None):
        m = self.m
        bsz, n = ids.shape
        x = F.embedding(ids, m.embed_tokens.weight)
        residual = None
        new_caches = []
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            h = _rms(x if residual is None else x + residual, layer.input_layernorm)
            residual = x if residual is None else x + residual
            qkv = F.linear(h, attn.qkv_proj.weight, attn.qkv_proj.bias)
            q, k, v = qkv.split([attn.qkv_proj.q_size, attn.qkv_proj.kv_size,
                                 attn.qkv_proj.kv_size], dim=-1)
            d = attn.head_dim
            q = q.view(bsz, n, -1, d).transpose(1, 2)
            k = k.view(bsz, n, -1, d).transpose(1, 2)
            v = v.view(bsz, n, -1, d).transpose(1, 2)
            if attn.q_norm is not None:
                q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
            cos = attn.rotary_emb.cos[start:start + n]
            sin = attn.rotary_emb.sin[start:start + n]
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            if caches is None:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                new_caches.append((k, v))
            else:
                kc, vc = caches[i]
                kc[:, :, start:start + n] = k
                vc[:, :, start:start + n] = v
                o = F.scaled_dot_product_attention(q, kc[:, :, :start + n], vc[:, :, :start + n],
                                                   enable_gqa=True)
            o = o.transpose(1, 2).reshape(bsz, n, -1)
            x = F.linear(o, attn.o_proj.weight, attn.o_proj.bias)
            h = _rms(x + residual, layer.post_attention_layernorm)
            residual = x + residual
            gate, up = F.linear(h, layer.mlp.gate_up_proj.weight).chunk(2, dim=-1)
            x = F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight)
        x = _rms(x + residual, m.norm)
        logits = F.linear(x[:, -1], m.lm_head.weight)
        return logits, new_caches


@dataclass
class FloorTimes:
    prefill_s: float
    decode_steps_s: list[float]
    first_tokens: list[int]

    @property
    def total_s(self) -> float:
        return self.prefill_s + sum(self.decode_steps_s)


def check_floor_supports(model_config) -> None:
    """The floor is a dense Llama-style decoder; say so for MoE / MLA models (whose
    benchmark is `radixlm bench moe --parts model`) instead of failing inside it."""
    if model_config.is_moe or model_config.is_mla:
        raise SystemExit(f"the plain-PyTorch floor covers dense Llama/Qwen models, not "
                         f"{model_config.architecture}; use `radixlm bench moe --parts model "
                         f"--model-path ...` for MoE and MLA models")


def measure_floor(runner, prompts: torch.Tensor, output_len: int, prefill_group: int,
                  repeats: int = 2) -> FloorTimes:
    """Greedy static-batch generation of `output_len` tokens for `prompts` [B, L] with the
    floor model on runner's weights: prefill in groups of `prefill_group` requests, then decode
    steps, each reading the sampled ids back to the host as an engine does. The last of
    `repeats` runs is reported (the first warms up)."""
    dev, mc = runner.device, runner.model_config
    check_floor_supports(mc)
    bs, n_in = prompts.shape
    floor = FloorModel(runner.model)
    caches = [tuple(torch.empty(bs, mc.num_kv_heads, n_in + output_len, mc.head_dim,
                                dtype=runner.dtype, device=dev) for _ in range(2))
              for _ in range(mc.num_layers)]
    ids = prompts.to(dev)
    last = torch.empty(bs, 1, dtype=torch.int64, device=dev)

    def prefill() -> float:
        sync_device(dev)
        t = time.perf_counter()
        for lo in range(0, bs, prefill_group):
            hi = min(lo + prefill_group, bs)
            logits, kv = floor.prefill(ids[lo:hi])
            for (kc, vc), (k, v) in zip(caches, kv):
                kc[lo:hi, :, :n_in] = k
                vc[lo:hi, :, :n_in] = v
            last[lo:hi, 0] = logits.argmax(-1)
            last[lo:hi].tolist()
        sync_device(dev)
        return time.perf_counter() - t

    def step(pos: int) -> float:
        sync_device(dev)
        t = time.perf_counter()
        logits = floor.decode(last, pos, caches)
        last[:, 0] = logits.argmax(-1)
        last.tolist()
        sync_device(dev)
        return time.perf_counter() - t

    for _ in range(repeats):
        prefill_s = prefill()
        first = last[:, 0].tolist()
        steps = [step(n_in + i) for i in range(output_len - 1)]
    return FloorTimes(prefill_s, steps, first)
