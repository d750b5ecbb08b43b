"""ModelConfig: the model facts the engine and the models need, read once from the HF config.

The HF config is a loosely typed bag whose field names differ between families and between
transformers versions (`rope_theta` vs `rope_parameters`, `num_local_experts` vs
`n_routed_experts`, ...). `ModelConfig.from_hf` is the one place that reads it; models and the
rest of the engine read only the typed fields below. The dataclass lives in core/ (which imports
nothing from the rest of the package) so that models/ can take it without importing
model_executor/, which sits above them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

_DTYPE_NAMES = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}

# Rotary scalings that layers/rotary.py implements. Anything else is refused when the config is
# read, before any weight is loaded, rather than silently served with the wrong positions.
ROPE_SCALING_TYPES = ("linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """A non-default rotary scaling. `factor` stretches the frequencies (both kinds); llama3
    also blends between scaled and unscaled frequencies with the remaining three fields."""

    rope_type: str                                  # one of ROPE_SCALING_TYPES
    factor: float
    low_freq_factor: float | None = None            # llama3 only
    high_freq_factor: float | None = None           # llama3 only
    original_max_position_embeddings: int | None = None   # llama3 and yarn
    # YaRN (DeepSeek): the ramp between extrapolated and interpolated frequencies, and the
    # magnitude corrections (mscale scales cos/sin; mscale_all_dim the attention softmax).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, params: Mapping[str, Any] | None) -> "RopeScaling | None":
        """Parse HF's `rope_scaling` / `rope_parameters` dict (None or the default rope: None).

        transformers v5 folds `rope_theta` into the same dict and writes `rope_type: default`
        for unscaled models; older configs say `type` instead of `rope_type`."""
        params = params or {}
        kind = params.get("rope_type", params.get("type", "default"))
        if kind in (None, "default"):
            return None
        if kind not in ROPE_SCALING_TYPES:
            raise ValueError(f"unsupported rope_scaling type {kind!r}")
        if kind == "linear":
            return cls(kind, float(params["factor"]))
        if kind == "yarn":
            if "original_max_position_embeddings" not in params or "factor" not in params:
                raise ValueError("rope_scaling yarn needs factor and "
                                 "original_max_position_embeddings")
            return cls(kind, float(params["factor"]),
                       original_max_position_embeddings=int(
                           params["original_max_position_embeddings"]),
                       beta_fast=float(params.get("beta_fast") or 32.0),
                       beta_slow=float(params.get("beta_slow") or 1.0),
                       mscale=_opt_float(params.get("mscale")),
                       mscale_all_dim=_opt_float(params.get("mscale_all_dim")),
                       attention_factor=_opt_float(params.get("attention_factor")),
                       truncate=bool(params.get("truncate", True)))
        return cls(kind, float(params["factor"]), float(params["low_freq_factor"]),
                   float(params["high_freq_factor"]),
                   int(params["original_max_position_embeddings"]))


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


_SIZES = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
          "vocab_size", "intermediate_size", "head_dim", "max_position_embeddings")


@dataclass(frozen=True)
class ModelConfig:
    """Typed model facts. `hf_config` is kept for the record (logs, debugging); models must
    not read it, so that a model can be built from a ModelConfig alone (tests do, with
    hf_config=None) and so that a field's HF spelling is decided here once."""

    hf_config: object
    architecture: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    context_len: int
    eos_token_ids: tuple[int, ...]
    # Dense decoder facts (Llama, Qwen2, Qwen3, ...).
    architectures: tuple[str, ...]
    max_position_embeddings: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    attention_bias: bool        # HF `attention_bias`; a model class may override (Qwen2)
    mlp_bias: bool
    qkv_bias: bool | None = None    # HF `qkv_bias` where a family has it (Qwen2-MoE)
    # Mixture of experts; num_experts == 0 means a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0    # all shared experts together; 0: none
    norm_topk_prob: bool = False
    # Which layers have experts (the others a dense MLP of intermediate_size): Qwen's
    # decoder_sparse_step / mlp_only_layers, DeepSeek's first_k_dense_replace / moe_layer_freq.
    moe_layers: frozenset[int] = frozenset()
    # DeepSeek routing: scoring_func, topk_method (None where the config has none), n_group,
    # topk_group, routed_scaling_factor.
    moe_scoring: str | None = None
    moe_topk_method: str | None = None
    moe_num_groups: int = 1
    moe_topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    # Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank == 0 means standard attention.
    # q_lora_rank None: queries are projected directly, without a low-rank step (as in HF).
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek-V3's rope_interleave (V2 always rotates interleaved pairs) and its
    # multi-token-prediction layers (stored after the last layer; not served).
    rope_interleave: bool = True
    num_nextn_predict_layers: int = 0
    # HF `quantization_config` as a plain dict (None: unquantized); the linear method that
    # serves it is chosen from here once quantized checkpoints are supported.
    quantization: dict[str, Any] | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @classmethod
    def from_hf(cls, hf_config, context_length: int | None,
                extra_eos: tuple[int, ...] = ()) -> "ModelConfig":
        """Read `hf_config` (a transformers PretrainedConfig or anything with its attributes).
        `context_length` (--context-length) may shorten the model's context, not extend it;
        `extra_eos` adds generation_config.json's EOS ids to the config's."""
        def get(name: str, default: Any = None) -> Any:
            value = getattr(hf_config, name, None)
            return default if value is None else value

        # The sizes everything is built from: positive integers, or the model cannot be built
        # (a config.json, or an --json-model-override-args, with "big" or 0 would otherwise
        # fail deep in the model's construction).
        for name in _SIZES:
            value = getattr(hf_config, name, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        max_pos = int(get("max_position_embeddings", 2048))
        if context_length is not None and context_length > max_pos:
            raise ValueError(f"--context-length {context_length} exceeds the model's "
                             f"max_position_embeddings ({max_pos})")
        heads = hf_config.num_attention_heads
        head_dim = get("head_dim") or hf_config.hidden_size // heads
        eos = get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        eos_ids += [e for e in extra_eos if e not in eos_ids]
        architectures = tuple(get("architectures") or ())
        # transformers v5 keeps rope_theta (and the scaling) in rope_parameters; older
        # versions have rope_theta and rope_scaling as separate attributes.
        rope_params = get("rope_parameters") or {}
        rope_theta = float(rope_params.get("rope_theta", get("rope_theta", 10000.0)))
        if not rope_theta > 0 or rope_theta == float("inf"):
            raise ValueError(f"rope_theta must be a positive number, got {rope_theta}")
        # Mixtral's experts are intermediate_size wide; Qwen-MoE and DeepSeek say so apart.
        moe_intermediate = int(get("moe_intermediate_size", 0) or get("intermediate_size", 0))
        num_experts = int(get("num_experts") or get("num_local_experts")
                          or get("n_routed_experts") or 0)
        return cls(
            hf_config=hf_config,
            architecture=(architectures or ("?",))[0],
            num_layers=hf_config.num_hidden_layers, num_attention_heads=heads,
            num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=head_dim, hidden_size=hf_config.hidden_size,
            vocab_size=hf_config.vocab_size, context_len=context_length or max_pos,
            eos_token_ids=tuple(eos_ids),
            architectures=architectures,
            max_position_embeddings=max_pos,
            intermediate_size=int(get("intermediate_size", 0)),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=RopeScaling.from_hf(rope_params or get("rope_scaling")),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            attention_bias=bool(get("attention_bias", False)),
            mlp_bias=bool(get("mlp_bias", False)),
            qkv_bias=None if get("qkv_bias") is None else bool(get("qkv_bias")),
            # Qwen2/3-MoE say num_experts, Mixtral num_local_experts, DeepSeek n_routed_experts.
            num_experts=num_experts,
            num_experts_per_tok=int(get("num_experts_per_tok", 0)),
            moe_intermediate_size=moe_intermediate,
            # Qwen2-MoE gives the shared expert's size; DeepSeek a count of expert-sized ones.
            shared_expert_intermediate_size=int(
                get("shared_expert_intermediate_size")
                or int(get("n_shared_experts", 0)) * moe_intermediate),
            norm_topk_prob=bool(get("norm_topk_prob", False)),
            moe_layers=_moe_layers(hf_config, num_experts),
            moe_scoring=get("scoring_func"),
            moe_topk_method=get("topk_method"),
            moe_num_groups=int(get("n_group", 1)),
            moe_topk_groups=int(get("topk_group", 1)),
            routed_scaling_factor=float(get("routed_scaling_factor", 1.0)),
            q_lora_rank=None if get("q_lora_rank") is None else int(get("q_lora_rank")),
            kv_lora_rank=int(get("kv_lora_rank", 0)),
            qk_nope_head_dim=int(get("qk_nope_head_dim", 0)),
            qk_rope_head_dim=int(get("qk_rope_head_dim", 0)),
            v_head_dim=int(get("v_head_dim", 0)),
            rope_interleave=bool(get("rope_interleave", True)),
            num_nextn_predict_layers=int(get("num_nextn_predict_layers", 0)),
            quantization=_quantization_dict(get("quantization_config")),
        )


def _moe_layers(hf_config, num_experts: int) -> frozenset[int]:
    """The layers whose MLP is a mixture of experts, by each family's own switches."""
    if num_experts == 0:
        return frozenset()
    n = hf_config.num_hidden_layers
    if getattr(hf_config, "first_k_dense_replace", None) is not None:      # DeepSeek
        first = int(hf_config.first_k_dense_replace)
        freq = int(getattr(hf_config, "moe_layer_freq", 1) or 1)
        return frozenset(i for i in range(first, n) if i % freq == 0)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())         # Qwen2/3-MoE
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    return frozenset(i for i in range(n) if i not in dense and (i + 1) % step == 0)


def _quantization_dict(value: Any) -> dict[str, Any] | None:
    """A copy as a plain dict: config.json gives a dict, transformers may give an object."""
    if value is None:
        return None
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return dict(value)


def resolve_dtype(name: str, hf_config, device: torch.device) -> torch.dtype:
    """--dtype auto: float32 on CPU (exact comparisons, no slow half kernels), else the
    checkpoint's dtype, with float32 checkpoints served in bfloat16 on GPU."""
    if name != "auto":
        return _DTYPE_NAMES[name]
    if device.type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(ckpt, str):
        ckpt = _DTYPE_NAMES.get(ckpt)
    if ckpt in (torch.float16, torch.bfloat16):
        return ckpt
    return torch.bfloat16
