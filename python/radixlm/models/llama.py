"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style), the base of Qwen2 and Qwen3.

Qwen2 adds q/k/v biases and Qwen3 adds per-head RMSNorm on q and k; both are switches here
(`qkv_bias`, `qk_norm`) that their own modules set, so the forward pass exists once.

Models are built from the typed ModelConfig (core/model_config.py) and read only its fields,
never the raw HF config, so every HF spelling is decided in one place.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from radixlm.core.forward_batch import ForwardBatch
from radixlm.core.kv_quant import CheckpointKVScales
from radixlm.core.kv_spec import KVCacheSpec
from radixlm.core.model_config import ModelConfig
from radixlm.distributed.parallel_state import SINGLE, TPGroup
from radixlm.layers.attention.radix_attention import RadixAttention
from radixlm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixlm.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                   RowParallelLinear, check_loaded_shape)
from radixlm.layers.moe.layer import expert_param_and_shard
from radixlm.layers.norm import RMSNorm
from radixlm.layers.rotary import RotaryEmbedding


# How a checkpoint that does not match the model's config is reported (a flag error: the CLI
# prints it as one line).
_DOES_NOT_FIT = ("--model-path: the checkpoint does not fit its config.json (or "
                 "--json-model-override-args)")


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, tp: TPGroup,
                 reduce_results: bool = True):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate],
                                                       bias=bias, tp=tp)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias, tp=tp,
                                           reduce_results=reduce_results)
        # Without reduce_results the output is a partial sum that the holder must reduce: the
        # decoder layer's next RMSNorm (see LlamaDecoderLayer), or an MoE block with its
        # routed experts' sum.
        self.partial_output_group = None if reduce_results else tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, tp: TPGroup, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool):
        super().__init__()
        # Under TP the output is this rank's partial sum, which the decoder layer's next
        # RMSNorm all-reduces (a bias would have to be added after that sum: then o_proj
        # reduces itself).
        defer = tp.size > 1 and not o_bias
        self.partial_output_group = tp if defer else None
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim,
                                          config.num_attention_heads, config.num_kv_heads,
                                          bias=qkv_bias, tp=tp)
        # This rank's heads (KV heads are replicated when there are fewer than ranks).
        self.num_heads = self.qkv_proj.q_size // self.head_dim
        self.num_kv_heads = self.qkv_proj.kv_size // self.head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim,
                                        config.hidden_size, bias=o_bias, tp=tp,
                                        reduce_results=not defer)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        # The cos/sin table covers the served context (--context-length may shorten it).
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.context_len, config.rope_theta,
                                          config.rope_scaling)
        self.attn = RadixAttention(layer_id, self.num_heads, self.num_kv_heads, self.head_dim,
                                   scaling=self.head_dim ** -0.5)

    def kv_cache_spec(self, num_layers: int) -> KVCacheSpec:
        """K and V of this rank's KV heads in every layer."""
        return KVCacheSpec(kind="mha", num_layers=num_layers, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        # (Qwen3's q/k norms run inside the rotary kernel when it is fused.) v stays a view of
        # qkv: the backends store and read it through its strides.
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)
        out = self.attn(q.reshape(-1, q_size), k.reshape(-1, kv_size), v, fb)
        return self.o_proj(out)


def partial_output_group(module: nn.Module) -> TPGroup | None:
    """The TP group over which `module`'s output is still a partial sum (its row-parallel
    projection left the all-reduce to the RMSNorm after it), or None when it is reduced."""
    return getattr(module, "partial_output_group", None)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residuals. The attention and MLP modules are built by
    the model class (`build_attention`, `build_mlp`), so MoE and MLA models reuse the rest.

    Under tensor parallelism the attention's and the MLP's outputs may be partial sums over the
    ranks (`partial_output_group`): the RMSNorm that follows each sums them, adds the residual
    and normalises, in one kernel on GPUs. The MLP's output is summed by the next layer's input
    norm (or the model's final norm): `input_reduce` is the previous layer's MLP group, which
    the model sets."""

    def __init__(self, config: ModelConfig, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_reduce: TPGroup | None = None

    def forward(self, positions, x, residual, fb):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual, reduce=self.input_reduce)
        x = self.self_attn(positions, x, fb)
        x, residual = self.post_attention_layernorm(
            x, residual, reduce=partial_output_group(self.self_attn))
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    qk_norm = False

    @staticmethod
    def attention_biases(config: ModelConfig) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): Llama's `attention_bias` switches both."""
        return config.attention_bias, config.attention_bias

    def __init__(self, config: ModelConfig, tp: TPGroup = SINGLE):
        super().__init__()
        self.config = config
        self.tp = tp
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.build_attention(config, i, tp),
                              self.build_mlp(config, i, tp))
            for i in range(config.num_layers))
        # Each layer's input norm sums the previous layer's MLP output where that is partial;
        # the final norm the last layer's.
        previous: TPGroup | None = None
        for layer in self.layers:
            layer.input_reduce = previous
            previous = partial_output_group(layer.mlp)
        self.final_reduce = previous
        # KV cache scales found among the checkpoint's tensors (load_weights), for an fp8 pool.
        self.checkpoint_kv_scales = CheckpointKVScales()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = config.tie_word_embeddings
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp,
                                      tie_to=self.embed_tokens if self.tie_word_embeddings else None)

    def build_attention(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        qkv_bias, o_bias = self.attention_biases(config)
        return LlamaAttention(config, layer_id, tp, qkv_bias, o_bias, self.qk_norm)

    def build_mlp(self, config: ModelConfig, layer_id: int, tp: TPGroup) -> nn.Module:
        # Under TP, without a bias (added after the sum), the output stays a partial sum that
        # the RMSNorm after the MLP sums (see LlamaDecoderLayer).
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, tp,
                        reduce_results=tp.size == 1 or config.mlp_bias)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        """Final hidden states [T, H]; logits are computed by the caller on the rows it needs."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, fb)
        x, _ = self.norm(x, residual, reduce=self.final_reduce)
        return x

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits in float32, written into `out` when given (the CUDA graphs' one
        output buffer, so the graphs need not each keep their own)."""
        logits = self.lm_head(hidden)
        return logits.float() if out is None else out.copy_(logits)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        """What the KV pool must hold per token, declared by the attention modules so that the
        memory code need not re-derive it from the config (K and V of this rank's KV heads;
        an MLA model's latent, kind "mla")."""
        return self.layers[0].self_attn.kv_cache_spec(len(self.layers))

    # ------------------------------------------------------------------ weights

    # checkpoint sub-name -> (our fused parameter, shard id)
    _fused = {
        ".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"),
        ".v_proj.": (".qkv_proj.", "v"),
        ".gate_proj.": (".gate_up_proj.", 0), ".up_proj.": (".gate_up_proj.", 1),
    }

    def checkpoint_to_param(self, name: str) -> tuple[str | None, Any]:
        """A checkpoint tensor's name (without "model.") -> (our parameter's name, the shard id
        its loader takes, or None); name None skips the tensor. Per-expert tensors go into
        the stacked expert weights (layers/moe/layer.py: expert_param_and_shard)."""
        expert = expert_param_and_shard(name)
        if expert is not None:
            return expert
        for old, (new, shard) in self._fused.items():
            if old in name:
                return name.replace(old, new), shard
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            name = name.removeprefix("model.")
            if self.checkpoint_kv_scales.take(name, tensor):
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            name, shard = self.checkpoint_to_param(name)
            if name is None:        # a tensor the model does not serve (the model says so)
                continue
            if name not in params:
                raise ValueError(f"{_DOES_NOT_FIT}: checkpoint tensor {name!r} has no matching "
                                 f"parameter")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            try:
                with torch.no_grad():
                    if loader is None:
                        check_loaded_shape(param, tensor, None)
                        param.data.copy_(tensor)
                    elif shard is None:
                        loader(param, tensor)
                    else:
                        loader(param, tensor, shard)
            except ValueError as e:
                raise ValueError(f"{_DOES_NOT_FIT}: {name}: {e}") from None
            loaded.add(name)
        missing = {n for n in params if n not in loaded}
        if self.tie_word_embeddings:
            missing.discard("lm_head.weight")
        # Stacked parameters (the experts) are loaded in parts: each says which it lacks.
        for prefix, module in self.named_modules():
            parts = getattr(module, "missing_weights", None)
            if parts is not None:
                missing.update(f"{prefix}.{part}" for part in parts())
        if missing:
            raise ValueError(f"{_DOES_NOT_FIT}: checkpoint is missing weights: "
                             f"{sorted(missing)[:8]}")
