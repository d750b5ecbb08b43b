"""DeepSeek-V2 / V3: multi-head latent attention (MLA) and DeepSeek's mixture of experts.

MLA caches one compressed vector per token instead of K and V per head:

    latent = [ c (kv_lora_rank) | k_rope (qk_rope_head_dim) ]      c = RMSNorm(kv_a(x)[:lora])

Each head's K and V are linear in c (kv_b_proj: per head, W_UK [nope, lora] and W_UV
[v, lora]), so attention can run on the latent directly ("weight absorption"):

    q_lat  = q_nope @ W_UK                          (per head: nope -> lora)
    score  = q_lat . c + q_rope . k_rope            (one shared "KV head" of width lora + rope)
    o_lat  = softmax(score) @ c                     (V is the latent's first lora values)
    o      = o_lat @ W_UV^T                         (per head: lora -> v), then o_proj

So the attention backends see MQA with head_dim = lora + rope and v_head_dim = lora, over a
latent pool (mem_cache/pools.py: MLAKVPool) that stores each token once, for every head.
This form is used for prefill and decode alike.

The MLP of the first `first_k_dense_replace` layers is dense; the others are MoE blocks:
V2 routes by softmax (optionally group-limited), V3 by sigmoid with a correction bias and
groups ranked by their two best experts (layers/moe/topk.py). V3's multi-token-prediction
layer (checkpoint layer index num_hidden_layers) is not used and its weights are skipped.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch
from radixlm.core.kv_spec import KVCacheSpec
from radixlm.core.model_config import ModelConfig
from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.attention.radix_attention import RadixAttention
from radixlm.layers.kernels import takes_one_row_gemv, use_fused
from radixlm.layers.linear import (ColumnParallelLinear, RowParallelLinear,
                                   current_linear_method)
from radixlm.layers.moe.topk import RoutingConfig
from radixlm.layers.norm import RMSNorm
from radixlm.layers.quantization.full_precision import full_precision
from radixlm.layers.rotary import RotaryEmbedding, yarn_mscale
from radixlm.models.llama import LlamaForCausalLM, LlamaMLP
from radixlm.models.moe_block import SparseMoeBlock


def mla_softmax_scale(config: ModelConfig) -> float:
    """1/sqrt(qk head dim), times YaRN's mscale(mscale_all_dim) squared when scaled."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rs = config.rope_scaling
    if rs is not None and rs.rope_type == "yarn" and rs.mscale_all_dim:
        scale *= yarn_mscale(rs.factor, rs.mscale_all_dim) ** 2
    return scale


class DeepseekMLAAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: TPGroup,
                 interleaved_rope: bool):
        super().__init__()
        h = config.hidden_size
        self.nope = config.qk_nope_head_dim
        self.rope = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.lora = config.kv_lora_rank
        self.num_heads = tp.shard(config.num_attention_heads, "num_attention_heads")
        all_heads = config.num_attention_heads
        qk_dim = self.nope + self.rope
        bias = config.attention_bias
        if config.q_lora_rank:
            self.q_a_proj = ColumnParallelLinear(h, [config.q_lora_rank], bias=bias, tp=SINGLE)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(config.q_lora_rank, [all_heads * qk_dim],
                                                 tp=tp)
            self.q_proj = None
        else:
            self.q_proj = ColumnParallelLinear(h, [all_heads * qk_dim], tp=tp)
        # The latent is the same on every rank (each rank attends with its own heads).
        self.kv_a_proj_with_mqa = ColumnParallelLinear(h, [self.lora + self.rope], bias=bias,
                                                       tp=SINGLE)
        self.kv_a_layernorm = RMSNorm(self.lora, config.rms_norm_eps)
        # Read as the absorbed per-head matrices (torch.bmm), never through its linear
        # method: kept in full precision in quantized models.
        self.kv_b_proj = ColumnParallelLinear(
            self.lora, [all_heads * (self.nope + self.v_dim)], tp=tp,
            linear_method=full_precision(current_linear_method()))
        self.o_proj = RowParallelLinear(all_heads * self.v_dim, h, bias=bias, tp=tp)
        # Checkpoints with interleaved rope pairs get their rope rows permuted once at load
        # (process_weights_after_loading), so the forward uses the plain "halves" rotation
        # (one fused kernel) instead of de-interleaving q and k every step.
        self.interleaved_checkpoint = interleaved_rope
        self.rotary_emb = RotaryEmbedding(self.rope, config.context_len, config.rope_theta,
                                          config.rope_scaling)
        self.attn = RadixAttention(layer_id, self.num_heads, 1, self.lora + self.rope,
                                   scaling=mla_softmax_scale(config), v_head_dim=self.lora)

    def kv_cache_spec(self, num_layers: int) -> KVCacheSpec:
        return KVCacheSpec(kind="mla", num_layers=num_layers, num_kv_heads=1,
                           head_dim=self.lora + self.rope, latent_value_dim=self.lora)

    @torch.no_grad()
    def process_weights_after_loading(self) -> None:
        """Reorder the rope rows of q's and the latent's projections from interleaved pairs
        (x0, x1), (x2, x3), ... to halves (x0, x2, ... | x1, x3, ...): the same rotation on
        the same pairs, and q.k unchanged because q and k are permuted alike."""
        if not self.interleaved_checkpoint:
            return
        perm = torch.cat([torch.arange(0, self.rope, 2), torch.arange(1, self.rope, 2)])
        q_layer = self.q_proj if self.q_proj is not None else self.q_b_proj
        head = self.nope + self.rope
        _check_rows_in_one_block(q_layer, [h * head + self.nope for h in range(self.num_heads)],
                                 self.rope)
        _check_rows_in_one_block(self.kv_a_proj_with_mqa, [self.lora], self.rope)
        for p in _per_row_tensors(q_layer):
            rows = p.data.view(self.num_heads, head, -1)[:, self.nope:]
            rows.copy_(rows[:, perm.to(p.device)].clone())
        for p in _per_row_tensors(self.kv_a_proj_with_mqa):
            rows = p.data[self.lora:]
            rows.copy_(rows[perm.to(p.device)].clone())
        self.interleaved_checkpoint = False

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, nope, lora], W_UV [heads, v, lora]): views of kv_b_proj's weight."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.lora)
        return w[:, :self.nope], w[:, self.nope:]

    def _latent(self, x: torch.Tensor, one_row: bool) -> torch.Tensor:
        """kv_a_proj_with_mqa(x); at one row through the one-row GEMV (`latent_tiles`) when the
        weight is 16-bit like x (a quantized layer keeps its own method)."""
        layer = self.kv_a_proj_with_mqa
        if one_row:
            from radixlm.layers.kernels import gemv_kernels
            tiles = gemv_kernels.latent_tiles(x, layer.weight)
            if tiles is not None:
                return gemv_kernels.gemv(x, layer.weight, layer.bias, tiles)
        return layer(x)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        t, nh = x.shape[0], self.num_heads
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(t, nh, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        one_row = takes_one_row_gemv(x)    # the decode step at batch 1
        # The latent row as cached: [c normalised | k_rope rotated] (one launch for the first).
        k_full = self.kv_a_layernorm.forward_leading(self._latent(x, one_row), self.lora)
        k_rope = k_full[:, self.lora:]
        q_rope, rotated = self.rotary_emb(positions, q_rope, k_rope.unsqueeze(1))
        if not use_fused(x) or rotated.data_ptr() != k_rope.data_ptr():
            k_rope.copy_(rotated.reshape(t, self.rope))     # PyTorch's rotation returns copies
        w_uk, w_uv = self._absorbed_weights()
        if one_row:     # no cuBLAS kernels, no concatenation
            from radixlm.layers.kernels.mla_absorb_kernels import absorb_output, absorb_query
            q_full = absorb_query(q_nope, w_uk, q_rope)
        else:
            q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk)              # [nh, T, lora]
            q_full = torch.cat([q_lat.transpose(0, 1), q_rope.to(q_lat.dtype)], dim=-1)
        o_lat = self.attn(q_full.reshape(t, -1), k_full, k_full[:, :self.lora], fb)
        if one_row:                                                      # [T, nh * lora]
            return self.o_proj(absorb_output(o_lat.view(t, nh, self.lora), w_uv))
        o = torch.bmm(o_lat.view(t, nh, self.lora).transpose(0, 1), w_uv.transpose(1, 2))
        return self.o_proj(o.transpose(0, 1).reshape(t, nh * self.v_dim))


def _per_row_tensors(layer: nn.Module) -> list[nn.Parameter]:
    """The parameters of a (not yet processed) linear layer with one row per output row: the
    weight, the bias, and an FP8 checkpoint's per-channel scales. (Block scales cover 128
    rows, and each head's 64 rope rows lie inside one block, so they stay as they are.)"""
    params = [layer.weight, layer.bias]
    spec = getattr(layer.linear_method, "spec", None)
    if spec is not None and not spec.online and spec.fp8_scales == "channel":
        params.append(layer.weight_scale)
    return [p for p in params if p is not None]


def _check_rows_in_one_block(layer: nn.Module, starts: list[int], count: int) -> None:
    """Rows permuted in place must share their FP8 scale block (the permutation moves values,
    not scales)."""
    spec = getattr(layer.linear_method, "spec", None)
    if spec is None or spec.fp8_block is None:
        return
    bn = spec.fp8_block[0]
    if any(s // bn != (s + count - 1) // bn for s in starts):
        raise ValueError(f"--model-path: this checkpoint's {bn}-row FP8 scale blocks split a "
                         f"head's rope rows, which are reordered at load; not supported")


def _check_routing(config: ModelConfig, scoring: str, methods: tuple[str, ...]) -> None:
    """Refuse a routing this family's class does not implement instead of serving it wrong."""
    arch = config.architecture
    if config.moe_scoring not in (None, scoring):
        raise ValueError(f"--model-path: {arch} with scoring_func {config.moe_scoring!r} is "
                         f"not supported (expected {scoring!r})")
    if config.moe_topk_method not in (None, *methods):
        raise ValueError(f"--model-path: {arch} with topk_method {config.moe_topk_method!r} "
                         f"is not supported (expected one of {list(methods)})")


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    correction_bias = False             # V3's load-balancing bias on the router

    def build_attention(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        return DeepseekMLAAttention(config, layer_id, tp, self.interleaved_rope(config))

    def interleaved_rope(self, config: ModelConfig) -> bool:
        """V2 always rotates interleaved pairs."""
        return True

    def routing(self, config: ModelConfig) -> RoutingConfig:
        """Softmax top-k, group-limited with `topk_method: group_limited_greedy`. As in
        DeepSeek's own code, the weights are either renormalised (`norm_topk_prob`) or scaled
        by routed_scaling_factor, not both (the released V2 configs scale)."""
        _check_routing(config, scoring="softmax", methods=("greedy", "group_limited_greedy"))
        grouped = config.moe_topk_method == "group_limited_greedy"
        return RoutingConfig(config.num_experts_per_tok, "softmax",
                             renormalize=config.norm_topk_prob,
                             num_groups=config.moe_num_groups if grouped else 1,
                             topk_groups=config.moe_topk_groups if grouped else 1,
                             group_score="max",
                             scaling_factor=(1.0 if config.norm_topk_prob
                                             else config.routed_scaling_factor))

    def build_mlp(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        if layer_id not in config.moe_layers:
            return LlamaMLP(config.hidden_size, config.intermediate_size, False, tp)
        # Router logits in fp32, as DeepSeek computes them: bf16 rounding can flip a choice.
        return SparseMoeBlock(config, tp, self.routing(config),
                              correction_bias=self.correction_bias, fp32_router=True)

    _layer_index = re.compile(r"^layers\.(\d+)\.")

    def checkpoint_to_param(self, name: str) -> tuple[str | None, Any]:
        m = self._layer_index.match(name)
        n = self.config.num_layers
        if m and n <= int(m.group(1)) < n + self.config.num_nextn_predict_layers:
            return None, None           # V3's multi-token-prediction layer: not served
        if ".self_attn.q_proj." in name:
            return name, None           # MLA's own q_proj, not a fused q/k/v
        return super().checkpoint_to_param(name)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    correction_bias = True

    def interleaved_rope(self, config: ModelConfig) -> bool:
        return config.rope_interleave

    def routing(self, config: ModelConfig) -> RoutingConfig:
        _check_routing(config, scoring="sigmoid", methods=("noaux_tc",))
        return RoutingConfig(config.num_experts_per_tok, "sigmoid",
                             renormalize=config.norm_topk_prob,
                             num_groups=config.moe_num_groups,
                             topk_groups=config.moe_topk_groups, group_score="top2_sum",
                             scaling_factor=config.routed_scaling_factor)
