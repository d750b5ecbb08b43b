"""GGUF -> HF conversion, checked against transformers' independent GGUF loader."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from radixlm.model_executor import gguf_convert
from radixlm.model_executor.gguf_convert import (
    bundled_gguf_path,
    convert_gguf_to_hf_dir,
    llama3_rope_scaling_from_factors,
    unpermute_rotary_rows,
)
from radixlm.model_executor.weight_source import (
    iter_safetensors_weights,
    load_hf_config,
    load_tokenizer,
    resolve_model_dir,
)

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about GPUs.<|im_end|>\n<|im_start|>assistant\n",
]
TOKENIZER_SAMPLES = [
    "Hello, world! This is plain ASCII.",
    "héllo wörld — naïve café, Ελληνικά, 你好，世界",
    "emoji 🤗🚀👩‍💻 done",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(12345))",
    "  multiple   spaces\n\nand 2024-01-01",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module", autouse=True)
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private RADIXLM_CACHE_DIR so the tests never touch the user's cache."""
    root = tmp_path_factory.mktemp("radixlm_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXLM_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def gguf_file() -> str:
    try:
        return bundled_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def converted(gguf_file: str, cache_root: Path) -> str:
    return convert_gguf_to_hf_dir(gguf_file)


def _hf_gguf_reference(path: str) -> tuple[str, str]:
    return os.path.dirname(path), os.path.basename(path)


def test_bundled_conversion_layout(converted: str, cache_root: Path) -> None:
    assert converted.startswith(str(cache_root))
    files = set(os.listdir(converted))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "generation_config.json"} <= files
    config = load_hf_config(converted)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.hidden_size, config.intermediate_size) == (576, 1536)
    assert config.num_hidden_layers == 30
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)
    with open(os.path.join(converted, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == 2

    names = {name for name, _ in iter_safetensors_weights(converted)}
    assert len(names) == 2 + 30 * 9
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert "model.layers.29.self_attn.q_proj.weight" in names


def test_logits_match_transformers_gguf_loader(converted: str, gguf_file: str) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    ours = LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    gguf_dir, gguf_name = _hf_gguf_reference(gguf_file)
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    ref.eval()
    tokenizer = load_tokenizer(converted)
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt)])
            a, b = ours(ids).logits, ref(ids).logits
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
            assert a[0, -1].argmax() == b[0, -1].argmax()


def test_tokenizer_matches_transformers_gguf_tokenizer(converted: str, gguf_file: str) -> None:
    from transformers import AutoTokenizer

    ours = load_tokenizer(converted)
    gguf_dir, gguf_name = _hf_gguf_reference(gguf_file)
    ref = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    for text in TOKENIZER_SAMPLES:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids) == text
    assert ours.eos_token_id == 2 and ours.eos_token == "<|im_end|>"
    assert ours.bos_token_id == 1 and ours.pad_token_id == 2
    assert ours.encode("<|im_end|>") == [2]  # special tokens stay single ids

    chat = ours.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nHi there<|im_end|>\n" in chat
    assert chat.endswith("<|im_start|>assistant\n")
    assert ours.model_max_length == 8192
    # A GGUF path works as --tokenizer-path too (served from the cached conversion).
    via_gguf = load_tokenizer(gguf_file)
    assert via_gguf.encode(TOKENIZER_SAMPLES[1]) == ours.encode(TOKENIZER_SAMPLES[1])


def test_second_call_is_cached(converted: str, gguf_file: str) -> None:
    weights = os.path.join(converted, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    start = time.perf_counter()
    again = convert_gguf_to_hf_dir(gguf_file)
    assert time.perf_counter() - start < 0.5
    assert again == converted
    assert os.stat(weights).st_mtime_ns == before
    leftovers = [p for p in os.listdir(os.path.dirname(converted)) if ".tmp-" in p]
    assert leftovers == []


def test_resolve_model_dir_accepts_gguf_and_hf(converted: str, gguf_file: str) -> None:
    assert resolve_model_dir(None, "auto") == (converted, "safetensors")
    assert resolve_model_dir(None, "dummy") == (converted, "dummy")
    assert resolve_model_dir(gguf_file, "auto") == (converted, "safetensors")
    assert resolve_model_dir(gguf_file, "gguf") == (converted, "safetensors")
    # The package dir holds exactly one .gguf and no safetensors.
    assert resolve_model_dir(os.path.dirname(gguf_file), "auto") == (converted, "safetensors")
    assert resolve_model_dir(converted, "auto") == (converted, "safetensors")
    assert resolve_model_dir(converted, "safetensors") == (converted, "safetensors")
    assert resolve_model_dir(converted, "dummy") == (converted, "dummy")


def test_resolve_model_dir_errors(tmp_path: Path, gguf_file: str) -> None:
    with pytest.raises(FileNotFoundError, match="--model-path"):
        resolve_model_dir(str(tmp_path / "missing"), "auto")
    with pytest.raises(FileNotFoundError, match="--model-path"):
        resolve_model_dir("no-such-org/no-such-model", "auto")
    with pytest.raises(ValueError, match="--load-format"):
        resolve_model_dir(str(tmp_path), "pickle")
    with pytest.raises(ValueError, match="no \\*.safetensors or \\*.gguf"):
        resolve_model_dir(str(tmp_path), "auto")
    with pytest.raises(ValueError, match="dummy needs a config.json"):
        resolve_model_dir(str(tmp_path), "dummy")
    with pytest.raises(ValueError, match="holds no .gguf"):
        resolve_model_dir(str(tmp_path), "gguf")
    with pytest.raises(ValueError, match="GGUF file"):
        resolve_model_dir(gguf_file, "safetensors")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        resolve_model_dir(str(tmp_path), "safetensors")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model_dir(str(tmp_path / "config.json"), "auto")
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several .gguf"):
        resolve_model_dir(str(tmp_path), "auto")


# ---- synthetic GGUF files: other architectures and the cache's failure modes ----------------


def write_tiny_gguf(path: Path, arch: str, *, head_dim: int = 16, qkv_bias: bool = False,
                    qk_norm: bool = False, tied: bool = True) -> Path:
    """A small random float32 GGUF (no tokenizer) laid out as llama.cpp would write it."""
    import gguf

    hidden, heads, kv_heads, ffn, vocab, layers = 64, 4, 2, 96, 128, 2
    rng = np.random.default_rng(0)

    def rand(*shape: int, offset: float = 0.0) -> np.ndarray:
        return (offset + 0.2 * rng.standard_normal(shape)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    if head_dim * heads != hidden:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_tensor("token_embd.weight", rand(vocab, hidden))
    if not tied:
        writer.add_tensor("output.weight", rand(vocab, hidden))
    writer.add_tensor("output_norm.weight", rand(hidden, offset=1.0))
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", rand(hidden, offset=1.0))
        writer.add_tensor(p + "ffn_norm.weight", rand(hidden, offset=1.0))
        writer.add_tensor(p + "attn_q.weight", rand(q_rows, hidden))
        writer.add_tensor(p + "attn_k.weight", rand(kv_rows, hidden))
        writer.add_tensor(p + "attn_v.weight", rand(kv_rows, hidden))
        writer.add_tensor(p + "attn_output.weight", rand(hidden, q_rows))
        if qkv_bias:
            writer.add_tensor(p + "attn_q.bias", rand(q_rows))
            writer.add_tensor(p + "attn_k.bias", rand(kv_rows))
            writer.add_tensor(p + "attn_v.bias", rand(kv_rows))
        if qk_norm:
            writer.add_tensor(p + "attn_q_norm.weight", rand(head_dim, offset=1.0))
            writer.add_tensor(p + "attn_k_norm.weight", rand(head_dim, offset=1.0))
        writer.add_tensor(p + "ffn_gate.weight", rand(ffn, hidden))
        writer.add_tensor(p + "ffn_up.weight", rand(ffn, hidden))
        writer.add_tensor(p + "ffn_down.weight", rand(hidden, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("llama", {"tied": False}),
        ("qwen2", {"qkv_bias": True}),
        # HF's qwen3 GGUF path ignores attention.key_length, so use Qwen3's real head_dim.
        ("qwen3", {"qk_norm": True, "head_dim": 128}),
    ],
)
def test_synthetic_architectures_match_transformers(
    tmp_path: Path, arch: str, kwargs: dict
) -> None:
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(tmp_path / "tiny.gguf", arch, **kwargs)
    converted = convert_gguf_to_hf_dir(str(path))
    ours = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    assert type(ours) is type(ref)
    ids = torch.tensor([[1, 5, 9, 33, 2, 7, 100, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, atol=1e-5, rtol=0)


def test_unpermute_rotary_rows_layout() -> None:
    """llama.cpp stores HF row (head h, half s, index i) at row h*hd + 2*i + s."""
    heads, head_dim, cols = 3, 8, 5
    hf = np.arange(heads * head_dim * cols, dtype=np.float32).reshape(heads * head_dim, cols)
    stored = np.empty_like(hf)
    for h in range(heads):
        for s in range(2):
            for i in range(head_dim // 2):
                stored[h * head_dim + 2 * i + s] = hf[h * head_dim + s * head_dim // 2 + i]
    np.testing.assert_array_equal(unpermute_rotary_rows(stored, heads), hf)


def test_llama3_rope_factors_recovered() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = LlamaConfig(
        hidden_size=2048, num_attention_heads=32, head_dim=64, rope_parameters=rope
    )
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / 500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    stored = (base / scaled.double()).float().numpy()  # what llama.cpp keeps as rope_freqs
    recovered = llama3_rope_scaling_from_factors(stored.astype(np.float64), 500000.0, 64)
    assert recovered == {k: v for k, v in rope.items() if k != "rope_theta"}


def test_concurrent_winner_and_failure_leave_no_partial_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    target = gguf_convert.cached_dir_for(str(path))
    real = gguf_convert._convert_into

    def failing(gguf_path: str, out_dir: str) -> None:
        real(gguf_path, out_dir)
        raise RuntimeError("crash mid-conversion")

    monkeypatch.setattr(gguf_convert, "_convert_into", failing)
    with pytest.raises(RuntimeError):
        convert_gguf_to_hf_dir(str(path))
    parent = os.path.dirname(target)
    assert not os.path.exists(target) and not [p for p in os.listdir(parent) if ".tmp-" in p]

    def racing(gguf_path: str, out_dir: str) -> None:
        real(gguf_path, out_dir)
        os.makedirs(target)  # another process renamed its finished copy in first
        real(gguf_path, target)

    monkeypatch.setattr(gguf_convert, "_convert_into", racing)
    assert convert_gguf_to_hf_dir(str(path)) == target
    assert os.path.isfile(os.path.join(target, "model.safetensors"))
    assert not [p for p in os.listdir(parent) if ".tmp-" in p]


def test_iter_safetensors_weights_honours_index(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, str(tmp_path / "part-1.safetensors"))
    save_file({"b": torch.ones(3)}, str(tmp_path / "part-2.safetensors"))
    save_file({"a": torch.zeros(2), "b": torch.ones(3)}, str(tmp_path / "consolidated.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = dict(iter_safetensors_weights(str(tmp_path)))
    assert sorted(got) == ["a", "b"] and got["b"].shape == (3,)


def test_cache_is_keyed_by_content_and_cleans_leftovers(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    cache = tmp_path / "cache"
    for sub in "abc":
        (tmp_path / sub).mkdir()
    first = write_tiny_gguf(tmp_path / "a" / "tiny.gguf", "llama")
    target = convert_gguf_to_hf_dir(str(first), str(cache))
    # The same file elsewhere (another venv, a fresh clone), with another mtime: no new copy.
    copy = tmp_path / "b" / "tiny.gguf"
    shutil.copy(first, copy)
    os.utime(copy, (1, 1))
    start = time.perf_counter()
    assert convert_gguf_to_hf_dir(str(copy), str(cache)) == target
    assert time.perf_counter() - start < 0.5
    with open(os.path.join(target, "radixlm_gguf_source.json")) as f:
        assert json.load(f)["content_key"] in os.path.basename(target)
    # Other content: another directory.
    other = write_tiny_gguf(tmp_path / "c" / "tiny.gguf", "qwen2", qkv_bias=True)
    parent = os.path.dirname(target)
    # What earlier runs left: a half-built copy of a process that died, and a conversion
    # under the old path+mtime key. The next conversion of this model removes both.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    half_built = os.path.join(parent, f".tiny-0123.tmp-{dead.pid}-abcd")
    os.makedirs(half_built)
    legacy = os.path.join(parent, "tiny-0123456789ab")
    os.makedirs(legacy)
    with open(os.path.join(legacy, "radixlm_gguf_source.json"), "w") as f:
        json.dump({"gguf_path": "/old/venv/tiny.gguf", "converter_version": 2}, f)
    other_target = convert_gguf_to_hf_dir(str(other), str(cache))
    assert other_target != target
    assert sorted(os.listdir(parent)) == sorted([os.path.basename(target),
                                                 os.path.basename(other_target)])
