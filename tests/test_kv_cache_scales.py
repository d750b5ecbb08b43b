"""KV cache scales shipped in FP8 checkpoints (core/kv_quant.py: CheckpointKVScales): read while
the weights load, one K and one V scale per layer in the fp8 pool (`--kv-cache-dtype
fp8_e4m3`), unused by a 16-bit pool, and refused with the tensor named when unusable."""

import os

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from radixlm.core.kv_quant import CheckpointKVScales, quantize
from radixlm.mem_cache.pools import KVPool
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.request import Req
from test_models_vs_hf import _extend, _hf_logits

F8 = torch.float8_e4m3fn
LAYERS = 2


def test_names_and_values():
    s = CheckpointKVScales()
    assert s.take("layers.0.self_attn.k_scale", torch.tensor(0.5))
    assert s.take("layers.0.self_attn.v_scale", torch.tensor([2.0]))
    assert s.take("layers.1.self_attn.kv_scale", torch.tensor(3.0, dtype=torch.bfloat16))
    assert s.take("layers.2.self_attn.k_proj.output_scale", torch.tensor(4.0))
    assert s.take("layers.2.self_attn.v_proj.output_scale", torch.tensor(5.0))
    for unused in ("layers.0.self_attn.q_scale", "layers.0.self_attn.prob_output_scale"):
        assert s.take(unused, torch.tensor(7.0))       # taken (not a parameter), not used
    for other in ("layers.0.self_attn.k_proj.weight", "layers.0.self_attn.k_proj.weight_scale",
                  "layers.0.self_attn.k_proj.input_scale", "layers.0.mlp.down_proj.weight"):
        assert not s.take(other, torch.tensor(1.0))
    assert s.per_layer(3) == ([0.5, 3.0, 4.0], [2.0, 3.0, 5.0])
    assert CheckpointKVScales().per_layer(3) is None


@pytest.mark.parametrize("value, match", [
    (torch.tensor(0.0), "positive finite"), (torch.tensor(-1.0), "positive finite"),
    (torch.tensor(float("nan")), "positive finite"), (torch.ones(4), "4 KV cache scales")])
def test_unusable_scale_is_refused_by_name(value, match):
    """Checked when an fp8 pool asks for the scales (`per_layer`), not while loading."""
    s = CheckpointKVScales()
    assert s.take("layers.0.self_attn.k_scale", torch.tensor(1.0))
    assert s.take("layers.0.self_attn.v_scale", value)
    with pytest.raises(ValueError, match=match) as e:
        s.per_layer(1)
    assert "layers.0.self_attn.v_scale" in str(e.value)


def test_scales_for_some_layers_only_are_refused():
    s = CheckpointKVScales()
    s.take("layers.0.self_attn.k_scale", torch.tensor(1.5))
    s.take("layers.0.self_attn.v_scale", torch.tensor(1.5))
    s.take("layers.1.self_attn.k_scale", torch.tensor(1.5))
    with pytest.raises(ValueError, match=r"no K scale for layer\(s\) \[2\]"):
        s.per_layer(3)
    s.take("layers.2.self_attn.k_scale", torch.tensor(1.5))
    with pytest.raises(ValueError, match=r"no V scale for layer\(s\) \[1, 2\]"):
        s.per_layer(3)


def test_pool_quantizes_each_layer_with_its_scales():
    pool = KVPool(16, LAYERS, 2, 8, F8, "cpu", k_scale=[0.5, 4.0], v_scale=[2.0, 0.25])
    k, v = torch.randn(3, 2, 8) * 100, torch.randn(3, 2, 8)
    locs = torch.tensor([1, 5, 9])
    for layer in range(LAYERS):
        pool.set_kv(layer, locs, k, v)
        ks, vs = pool.scales(layer)
        assert torch.equal(pool.k_buffers[layer][locs].view(torch.uint8),
                           quantize(k, ks, F8).view(torch.uint8))
        assert torch.equal(pool.v_buffers[layer][locs].view(torch.uint8),
                           quantize(v, vs, F8).view(torch.uint8))
    assert pool.scales(0) == (0.5, 2.0) and pool.scales(1) == (4.0, 0.25)
    with pytest.raises(ValueError, match="1 k scales for a pool of 2 layers"):
        KVPool(16, LAYERS, 2, 8, F8, "cpu", k_scale=[0.5])
    with pytest.raises(ValueError, match="fp8 pools only"):
        KVPool(16, LAYERS, 2, 8, torch.float32, "cpu", v_scale=[1.0, 2.0])


def _checkpoint(path, scales: dict[str, float | torch.Tensor]) -> str:
    """A tiny fp32 Llama whose V projections are so large that V overflows fp8 (+-448) unless
    scaled, plus `scales` (a value or a tensor each) as checkpoint tensors."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=LAYERS, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, torch_dtype="float32")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.mul_(3000)
    model.save_pretrained(path)
    if scales:
        f = os.path.join(path, "model.safetensors")
        tensors = load_file(f)
        tensors.update({f"model.{name}": torch.as_tensor(value, dtype=torch.float32)
                        for name, value in scales.items()})
        save_file(tensors, f, metadata={"format": "pt"})
    return str(path)


def _runner(path, kv_cache_dtype: str):
    return create_runner_and_kv(RunnerConfig(model_path=path, device="cpu", dtype="float32",
                                             kv_cache_dtype=kv_cache_dtype,
                                             max_total_tokens=256))


def _prefill_logits(runner, kv, prompt: list[int]) -> torch.Tensor:
    return _extend(runner, kv, [Req("r", prompt, SamplingParams(), seed=0)])[0]


def test_fp8_cache_uses_the_checkpoints_scales(tmp_path):
    """With the checkpoint's V scale the fp8 cache holds the large V values within fp8's
    rounding; with the default 1.0 it clamps them. The logits say which: the scaled cache is
    close to HF transformers' fp32 logits, the clamped one far from them."""
    scales = {f"layers.{i}.self_attn.{n}": s for i in range(LAYERS)
              for n, s in (("k_scale", 1.0), ("v_scale", 16.0))}
    with_scales = _checkpoint(tmp_path / "scaled", scales)
    without = _checkpoint(tmp_path / "plain", {})
    hf = transformers.AutoModelForCausalLM.from_pretrained(without, dtype=torch.float32).eval()
    prompt = torch.randint(0, 128, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = _hf_logits(hf, prompt)[-1]

    runner, kv = _runner(with_scales, "fp8_e4m3")
    assert runner.kv_pool.k_scales == [1.0] * LAYERS
    assert runner.kv_pool.v_scales == [16.0] * LAYERS
    scaled = _prefill_logits(runner, kv, prompt)
    runner, kv = _runner(without, "fp8_e4m3")
    assert runner.kv_pool.v_scales == [1.0] * LAYERS
    clamped = _prefill_logits(runner, kv, prompt)

    err_scaled, err_clamped = ((x - ref).abs().max().item() for x in (scaled, clamped))
    assert err_scaled < 0.25 * err_clamped, (err_scaled, err_clamped)
    assert err_scaled < 0.1 * ref.abs().max().item(), (err_scaled, ref.abs().max().item())


def test_16_bit_cache_loads_and_ignores_the_scales(tmp_path):
    """A checkpoint with KV scales loads into a full-precision cache (it used to fail on the
    unknown tensors), which stores K and V unscaled and matches HF transformers."""
    path = _checkpoint(tmp_path, {f"layers.{i}.self_attn.kv_scale": 16.0 for i in range(LAYERS)})
    runner, kv = _runner(path, "auto")
    assert runner.kv_pool.k_scales == runner.kv_pool.v_scales == [1.0] * LAYERS
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = list(range(3, 20))
    torch.testing.assert_close(_prefill_logits(runner, kv, prompt), _hf_logits(hf, prompt)[-1],
                               atol=1e-4, rtol=1e-4)


def test_checkpoint_with_scales_for_one_layer_is_refused_for_fp8(tmp_path):
    """Scales for some layers only: an fp8 cache refuses them (the others' would be a guess);
    a full-precision cache, which does not use them, loads."""
    path = _checkpoint(tmp_path, {"layers.0.self_attn.kv_scale": 2.0})
    with pytest.raises(ValueError, match=r"no K scale for layer\(s\) \[1\]"):
        _runner(path, "fp8_e4m3")
    runner, _ = _runner(path, "auto")
    assert runner.kv_pool.k_scales == [1.0] * LAYERS


def test_per_head_scales_load_into_a_16_bit_cache_only(tmp_path):
    """Per-head scales (one per KV head): an fp8 cache takes one per layer and refuses them,
    naming the tensor; a full-precision cache does not use them and loads."""
    path = _checkpoint(tmp_path, {f"layers.{i}.self_attn.{n}": torch.full((2,), 4.0)
                                  for i in range(LAYERS) for n in ("k_scale", "v_scale")})
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.k_scale' holds 2 KV"):
        _runner(path, "fp8_e4m3")
    runner, _ = _runner(path, "auto")
    assert runner.kv_pool.v_scales == [1.0] * LAYERS
