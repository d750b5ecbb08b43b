"""ModelConfig (core/model_config.py) reads every HF spelling once; models are built from it
alone (never the raw HF config); each model declares its KV cache as a KVCacheSpec."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from radixlm.core.kv_spec import KVCacheSpec
from radixlm.core.model_config import ModelConfig, RopeScaling
from radixlm.distributed.parallel_state import TPGroup
from radixlm.mem_cache.pools import KVPool
from radixlm.models.registry import resolve_model_class

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def _hf(kind: str, **extra):
    if kind == "llama":
        return transformers.LlamaConfig(**{**TINY, **extra}, architectures=["LlamaForCausalLM"])
    if kind == "qwen2":
        return transformers.Qwen2Config(**{**TINY, **extra}, architectures=["Qwen2ForCausalLM"])
    return transformers.Qwen3Config(**{**TINY, "head_dim": 32, **extra},
                                    architectures=["Qwen3ForCausalLM"])


def test_reexported_from_model_executor():
    from radixlm.model_executor import model_config as old
    from radixlm.core import model_config as new
    assert old.ModelConfig is new.ModelConfig and old.resolve_dtype is new.resolve_dtype


def test_dense_fields_from_transformers_config():
    mc = ModelConfig.from_hf(_hf("llama", rope_theta=500000.0, rope_scaling=LLAMA3,
                                 attention_bias=True, tie_word_embeddings=True), 128, (7,))
    assert (mc.architecture, mc.architectures) == ("LlamaForCausalLM", ("LlamaForCausalLM",))
    assert (mc.num_layers, mc.num_attention_heads, mc.num_kv_heads, mc.head_dim) == (2, 4, 2, 16)
    assert (mc.context_len, mc.max_position_embeddings, mc.intermediate_size) == (128, 256, 128)
    assert mc.rms_norm_eps == 1e-5 and mc.rope_theta == 500000.0
    assert mc.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 32)
    assert mc.tie_word_embeddings and mc.attention_bias and not mc.mlp_bias
    assert 7 in mc.eos_token_ids
    # Placeholders of the coming features: a dense, unquantized, standard-attention model.
    assert not mc.is_moe and not mc.is_mla and mc.quantization is None
    assert mc.q_lora_rank is None and mc.num_experts_per_tok == 0


def test_default_rope_and_older_spellings():
    assert ModelConfig.from_hf(_hf("qwen2"), None).rope_scaling is None
    old = SimpleNamespace(architectures=["LlamaForCausalLM"], num_hidden_layers=1,
                          num_attention_heads=2, hidden_size=8, vocab_size=11,
                          intermediate_size=16, rms_norm_eps=1e-6, rope_theta=1234.0,
                          rope_scaling={"type": "linear", "factor": 2.0})
    mc = ModelConfig.from_hf(old, None)
    assert mc.rope_theta == 1234.0 and mc.rope_scaling == RopeScaling("linear", 2.0)
    assert (mc.num_kv_heads, mc.head_dim, mc.context_len) == (2, 4, 2048)
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'dynamic'"):
        ModelConfig.from_hf(SimpleNamespace(**{**vars(old), "rope_scaling": {
            "rope_type": "dynamic", "factor": 4.0}}), None)
    with pytest.raises(ValueError, match="yarn needs factor and original_max_position"):
        ModelConfig.from_hf(SimpleNamespace(**{**vars(old), "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0}}), None)


def test_moe_mla_and_quantization_spellings():
    base = dict(architectures=["X"], num_hidden_layers=1, num_attention_heads=2, hidden_size=8,
                vocab_size=11)
    qwen_moe = ModelConfig.from_hf(SimpleNamespace(
        **base, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, norm_topk_prob=False), None)
    assert (qwen_moe.num_experts, qwen_moe.num_experts_per_tok) == (60, 4)
    assert (qwen_moe.moe_intermediate_size, qwen_moe.shared_expert_intermediate_size) == (
        1408, 5632)
    mixtral = ModelConfig.from_hf(SimpleNamespace(**base, num_local_experts=8,
                                                  num_experts_per_tok=2), None)
    assert mixtral.is_moe and mixtral.num_experts == 8
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    deepseek = ModelConfig.from_hf(SimpleNamespace(
        **base, n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408,
        n_shared_experts=2, norm_topk_prob=True, q_lora_rank=None, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        quantization_config=quant), None)
    assert deepseek.num_experts == 64 and deepseek.shared_expert_intermediate_size == 2816
    assert deepseek.norm_topk_prob and deepseek.is_mla and deepseek.q_lora_rank is None
    assert (deepseek.kv_lora_rank, deepseek.qk_nope_head_dim, deepseek.qk_rope_head_dim,
            deepseek.v_head_dim) == (512, 128, 64, 128)
    assert deepseek.quantization == quant and deepseek.quantization is not quant


def test_kv_cache_spec_bytes():
    spec = KVCacheSpec("mha", num_layers=32, num_kv_heads=8, head_dim=128)
    assert spec.bytes_per_token(torch.bfloat16) == 2 * 32 * 8 * 128 * 2
    assert spec.bytes_per_token(torch.float32) == KVPool.bytes_per_token(32, 8, 128,
                                                                         torch.float32)
    mla = KVCacheSpec("mla", num_layers=27, num_kv_heads=1, head_dim=512 + 64,
                      latent_value_dim=512)
    assert mla.tensors_per_layer == 1 and mla.bytes_per_token(torch.bfloat16) == 27 * 576 * 2
    with pytest.raises(ValueError):
        KVCacheSpec("mla", num_layers=1, num_kv_heads=2, head_dim=8, latent_value_dim=4)
    with pytest.raises(ValueError):     # V must be a prefix of the latent
        KVCacheSpec("mla", num_layers=1, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError):
        KVCacheSpec("gqa", num_layers=1, num_kv_heads=2, head_dim=8)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_models_build_from_typed_config_alone(kind):
    """hf_config=None: a model that still read the raw HF config would fail here."""
    mc = dataclasses.replace(ModelConfig.from_hf(_hf(kind), 64), hf_config=None)
    model = resolve_model_class(mc)(mc)
    attn = model.layers[0].self_attn
    assert len(model.layers) == 2 and attn.rotary_emb.cos.shape == (64, mc.head_dim)
    assert (attn.qkv_proj.bias is not None) == (kind == "qwen2")   # Qwen2: q/k/v bias always
    assert attn.o_proj.bias is None
    assert (attn.q_norm is not None) == (kind == "qwen3")
    spec = model.kv_cache_spec
    assert spec == KVCacheSpec("mha", 2, 2, mc.head_dim)
    for dtype in (torch.float32, torch.bfloat16):
        assert spec.bytes_per_token(dtype) == 2 * 2 * 2 * mc.head_dim * dtype.itemsize


def test_kv_cache_spec_is_per_rank():
    mc = ModelConfig.from_hf(_hf("llama"), 64)
    model = resolve_model_class(mc)(mc, tp=TPGroup(rank=1, size=2))
    assert model.kv_cache_spec == KVCacheSpec("mha", 2, 1, 16)


def test_models_do_not_read_the_hf_config():
    models = Path(__file__).resolve().parent.parent / "python" / "radixlm" / "models"
    for path in models.glob("*.py"):
        text = path.read_text()
        assert "hf_config" not in text and "getattr(config" not in text, path.name


@pytest.mark.parametrize("params", [
    {"factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
     "original_max_position_embeddings": 4096},                       # DeepSeek-V2
    {"factor": 8.0, "original_max_position_embeddings": 2048},          # factor only
    {"factor": 8.0, "original_max_position_embeddings": 2048, "mscale_all_dim": 1.0},
    {"factor": 8.0, "original_max_position_embeddings": 2048, "attention_factor": 1.5},
], ids=["deepseek", "plain", "mscale-all-dim-only", "attention-factor"])
def test_yarn_matches_hf(params):
    """YaRN frequencies and magnitude against transformers' own computation."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from radixlm.layers.rotary import _inv_freq, rope_magnitude
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, **params}
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64,
                                   max_position_embeddings=16384, rope_parameters=rope)
    hf_inv, hf_mag = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    scaling = RopeScaling.from_hf(rope)
    torch.testing.assert_close(_inv_freq(64, 10000.0, scaling).float(), hf_inv.float())
    assert rope_magnitude(scaling) == pytest.approx(hf_mag)


def _fields(mc: ModelConfig) -> dict:
    return {f.name: getattr(mc, f.name) for f in dataclasses.fields(mc) if f.name != "hf_config"}


CONFIG_DIRS = sorted(p for p in (Path(__file__).parent.parent / "benchmarks" / "configs").iterdir()
                     if (p / "config.json").exists())


@pytest.mark.parametrize("path", CONFIG_DIRS, ids=lambda p: p.name)
def test_config_json_read_directly_equals_transformers(path):
    """read_hf_config skips transformers (seconds of start-up) for a config.json that states
    every family-specific field; the ModelConfig is the same as through AutoConfig."""
    from radixlm.model_executor.weight_source import load_hf_config, read_hf_config
    fast = read_hf_config(str(path))
    # (DeepSeek-V2-Lite's config.json has no head_dim: it goes through transformers)
    assert isinstance(fast, SimpleNamespace) == (path.name != "deepseek-v2-lite")
    assert _fields(ModelConfig.from_hf(fast, None)) == _fields(
        ModelConfig.from_hf(load_hf_config(str(path)), None))


def test_config_json_missing_a_family_default_goes_through_transformers(tmp_path):
    """Qwen3's head_dim defaults to 128 in transformers, not hidden / heads: a config.json
    without it is read by AutoConfig, which knows the family's default."""
    import json
    from radixlm.model_executor.weight_source import read_hf_config
    src = Path(__file__).parent.parent / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"
    raw = json.loads(src.read_text())
    raw.pop("head_dim")
    raw["hidden_size"] = 1024   # heads 16: hidden / heads would say 64
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = read_hf_config(str(tmp_path))
    assert not isinstance(cfg, SimpleNamespace)
    assert ModelConfig.from_hf(cfg, None).head_dim == 128


def test_bundled_model_config_read_directly_equals_transformers():
    from radixlm.model_executor.weight_source import (load_hf_config, read_hf_config,
                                                       resolve_model_dir)
    hf_dir, _ = resolve_model_dir(None, "auto")     # the bundled GGUF, converted
    fast = read_hf_config(hf_dir)
    assert isinstance(fast, SimpleNamespace)
    assert _fields(ModelConfig.from_hf(fast, None)) == _fields(
        ModelConfig.from_hf(load_hf_config(hf_dir), None))
