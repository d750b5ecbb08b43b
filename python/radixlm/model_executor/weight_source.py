"""Where weights come from: resolve `--model-path` / `--load-format` to an HF directory and
stream its tensors. Knows nothing about model classes (see loader.py for that)."""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import types
from typing import TYPE_CHECKING, Any, Iterator

from radixlm.model_executor.gguf_convert import bundled_gguf_path, convert_gguf_to_hf_dir
from radixlm.utils.hub_ids import could_be_hub_id

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors", "gguf", "dummy")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def resolve_model_dir(model_path: str | None, load_format: str, revision: str | None = None,
                      download_dir: str | None = None) -> tuple[str, str]:
    """Return (hf_dir, effective_format) where effective_format is "safetensors" or "dummy".

    GGUF inputs are converted once into a cached HF directory, so callers only ever see HF
    layouts. None means the bundled default model. A Hugging Face Hub id is looked up in the
    local Hub cache (`download_dir`, else Hugging Face's), at `revision`, and downloaded there
    when it is not cached.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"Unknown --load-format {load_format!r}; expected one of {list(LOAD_FORMATS)}"
        )
    effective = "dummy" if load_format == "dummy" else "safetensors"
    if model_path is None:
        return convert_gguf_to_hf_dir(bundled_gguf_path()), effective

    path = _local_path(model_path, revision, download_dir)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(
                f"--model-path {model_path!r} is a file but not a .gguf; pass a GGUF file or a "
                "Hugging Face model directory"
            )
        if load_format == "safetensors":
            raise ValueError(
                f"--model-path {model_path!r} is a GGUF file; use --load-format auto or gguf"
            )
        return convert_gguf_to_hf_dir(path), effective

    ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
    has_safetensors = bool(glob.glob(os.path.join(path, "*.safetensors")))
    has_config = os.path.isfile(os.path.join(path, "config.json"))

    if load_format == "dummy":
        if has_config:
            return path, "dummy"
        if len(ggufs) == 1:
            return convert_gguf_to_hf_dir(ggufs[0]), "dummy"
        raise ValueError(f"--load-format dummy needs a config.json in --model-path {model_path!r}")
    if load_format == "gguf" or (load_format == "auto" and not has_safetensors and ggufs):
        return convert_gguf_to_hf_dir(_single_gguf(model_path, ggufs)), "safetensors"
    if not has_safetensors:
        has_bin = bool(glob.glob(os.path.join(path, "*.bin")))
        extra = " (*.bin checkpoints are not supported; convert them to safetensors)" if has_bin else ""
        raise ValueError(
            f"--model-path {model_path!r} holds no *.safetensors or *.gguf weights{extra}; "
            "use --load-format dummy to run with random weights"
        )
    if not has_config:
        raise ValueError(f"--model-path {model_path!r} has safetensors weights but no config.json")
    return path, "safetensors"


# What a download fetches: the config, tokenizer and safetensors weights (not the *.bin / *.pth
# copies many repositories also hold, which this engine does not read).
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken",
                      "*.py"]


def path_error(e: BaseException, name: str) -> str:
    """An error of loading a model (which names the path by the server's --model-path) for a
    path the caller calls `name`: a draft model's flag, /update_weights_from_disk's field."""
    message = str(e)
    if "--model-path" in message:
        return message.replace("--model-path", name)
    return f"{name}: {message}"


def _local_path(path: str, revision: str | None = None, download_dir: str | None = None,
                flag: str = "model-path", patterns: list[str] = _DOWNLOAD_PATTERNS) -> str:
    """An existing local path, or a Hugging Face Hub id: from the local Hub cache, else
    downloaded into it (HF_HUB_OFFLINE=1 forbids the download). Errors name `flag`."""
    expanded = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(expanded):
        return expanded
    if not could_be_hub_id(path):
        raise FileNotFoundError(f"--{flag} {path!r} does not exist (and is not a Hugging Face "
                                f"id such as ORG/NAME)")
    from huggingface_hub import snapshot_download

    cache_dir = os.path.expanduser(download_dir) if download_dir else None
    at = f" at revision {revision!r}" if revision else ""
    try:
        return snapshot_download(path, revision=revision, cache_dir=cache_dir,
                                 local_files_only=True)
    except Exception:
        pass  # not cached: download it
    logger.info("downloading %s%s from the Hugging Face Hub", path, at)
    try:
        return snapshot_download(path, revision=revision, cache_dir=cache_dir,
                                 allow_patterns=patterns)
    except Exception as e:
        raise FileNotFoundError(
            f"--{flag} {path!r} is not a local path, and the Hugging Face repository"
            f"{at} could not be found in the local cache or downloaded "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _single_gguf(model_path: str, ggufs: list[str]) -> str:
    if len(ggufs) == 1:
        return ggufs[0]
    if not ggufs:
        raise ValueError(f"--load-format gguf but --model-path {model_path!r} holds no .gguf file")
    names = ", ".join(os.path.basename(g) for g in ggufs)
    raise ValueError(
        f"--model-path {model_path!r} holds several .gguf files ({names}); pass one file's path"
    )


def safetensors_files(hf_dir: str) -> list[str]:
    """Weight files of `hf_dir`; the index, when present, decides (repos sometimes ship
    extra consolidated copies that must not be loaded twice)."""
    index_path = os.path.join(hf_dir, SAFETENSORS_INDEX)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        return [os.path.join(hf_dir, name) for name in sorted(set(weight_map.values()))]
    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {hf_dir}")
    return files


def iter_safetensors_weights(hf_dir: str) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Yield (name, tensor) for every weight, one tensor at a time (memory-mapped reads)."""
    from safetensors import safe_open

    for path in safetensors_files(hf_dir):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


# transformers' lazy top-level module is not safe to import from two threads at once (the
# second can see it half-initialised: "cannot import name 'AutoConfig'"), and the scheduler
# loads its tokenizer on a thread while it reads the config.
_TRANSFORMERS_LOCK = threading.Lock()


# --trust-remote-code, set in each process from its ServerArgs (set_trust_remote_code): lets
# transformers run Python code shipped with a checkpoint's tokenizer or config.
_TRUST_REMOTE_CODE = False


def set_trust_remote_code(trust: bool) -> None:
    global _TRUST_REMOTE_CODE
    _TRUST_REMOTE_CODE = bool(trust)


def load_hf_config(hf_dir: str) -> "PretrainedConfig":
    with _TRANSFORMERS_LOCK:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(hf_dir, trust_remote_code=_TRUST_REMOTE_CODE)
        except Exception as e:
            # (transformers' reasons: not JSON, not an object, an unknown model_type, a field
            # its config class refuses): one line naming the flag
            raise ValueError(f"--model-path: {hf_dir}/config.json cannot be read: "
                             f"{_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    """The exception as one line (transformers' messages run over several), at most ~300
    characters."""
    text = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


# What config.json must state for read_hf_config to read it directly: the fields whose
# transformers default differs between families (or that have none). A config missing one goes
# through transformers, whose per-family defaults then decide.
_EXPLICIT = ("model_type", "architectures", "hidden_size", "num_attention_heads",
             "num_key_value_heads", "num_hidden_layers", "vocab_size",
             "max_position_embeddings", "rms_norm_eps", "intermediate_size",
             "tie_word_embeddings", "eos_token_id")
_EXPLICIT_BY_TYPE = {
    "qwen3": ("head_dim",),
    "qwen3_moe": ("head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    # (transformers sets DeepSeek's head_dim to qk_rope_head_dim when config.json has none;
    # V3's defaults for norm_topk_prob, the MTP layers and the scoring differ from V2's)
    **{t: ("head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
           "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
           "moe_intermediate_size", "first_k_dense_replace", "topk_method", "n_group",
           "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func",
           "num_nextn_predict_layers") for t in ("deepseek_v2", "deepseek_v3")},
}


def read_hf_config(hf_dir: str) -> Any:
    """The model's config.json as an object with its keys as attributes, read directly when it
    states every field whose default differs between families, else through transformers'
    AutoConfig (load_hf_config). Reading it directly saves the server seconds of start-up:
    AutoConfig.from_pretrained took 5.6-8 s on the GPU machine (imports and validation)."""
    try:
        with open(os.path.join(hf_dir, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return load_hf_config(hf_dir)   # (its error message names the problem)
    if not isinstance(raw, dict):
        return load_hf_config(hf_dir)
    needed = _EXPLICIT + _EXPLICIT_BY_TYPE.get(raw.get("model_type"), ())
    rope_theta = "rope_theta" in raw or "rope_theta" in (raw.get("rope_parameters") or {})
    if not rope_theta or any(key not in raw for key in needed) or "text_config" in raw:
        return load_hf_config(hf_dir)
    return types.SimpleNamespace(**raw)


# What a tokenizer-only download fetches (--tokenizer-path naming a Hub id).
_TOKENIZER_PATTERNS = ["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken", "*.py"]


def resolve_tokenizer_dir(tokenizer_path: str, download_dir: str | None = None) -> str:
    """The directory holding `tokenizer_path`'s tokenizer files: a GGUF file (or a directory
    holding only one) is converted first; a Hub id is fetched into the local Hub cache
    (FileNotFoundError naming --tokenizer-path where it cannot be)."""
    path = _local_path(tokenizer_path, download_dir=download_dir, flag="tokenizer-path",
                       patterns=_TOKENIZER_PATTERNS)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return convert_gguf_to_hf_dir(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "tokenizer_config.json")):
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) == 1:
            return convert_gguf_to_hf_dir(ggufs[0])
    return path


def load_tokenizer(tokenizer_path: str, mode: str = "auto",
                   flag: str = "tokenizer-path") -> "PreTrainedTokenizerBase":
    """AutoTokenizer for a directory; a GGUF file (or a directory holding only one) is
    converted first so its tokenizer files exist. mode "slow" (--tokenizer-mode) asks for the
    Python tokenizer (transformers falls back to the fast one where there is none). Errors
    name `flag`, where the path came from."""
    with _TRANSFORMERS_LOCK:
        from transformers import AutoTokenizer

    path = resolve_tokenizer_dir(tokenizer_path)
    with _TRANSFORMERS_LOCK:
        try:
            return AutoTokenizer.from_pretrained(path, trust_remote_code=_TRUST_REMOTE_CODE,
                                                 use_fast=mode != "slow")
        except Exception as e:      # (transformers checks the model's config here too)
            raise ValueError(
                f"--{flag}: no tokenizer could be loaded from {tokenizer_path!r} (a "
                f"directory with the tokenizer's files, a GGUF file, or a Hugging Face id; "
                f"--skip-tokenizer-init serves token ids without one): {_first_line(e)}"
            ) from None


__all__ = [
    "LOAD_FORMATS",
    "iter_safetensors_weights",
    "load_hf_config",
    "read_hf_config",
    "load_tokenizer",
    "resolve_tokenizer_dir",
    "resolve_model_dir",
    "safetensors_files",
    "set_trust_remote_code",
]
