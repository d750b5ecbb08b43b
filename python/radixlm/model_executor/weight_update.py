"""Serving new weights without a restart (SGLang's /update_weights_from_disk): the served
model's parameters are overwritten in place from another checkpoint of the same architecture
(a fine-tuned or RL-updated copy). In place, so the CUDA graphs, which hold the parameters'
addresses, stay valid.

Refused up front, before anything is overwritten: a checkpoint whose config differs in shape,
a quantized model (its weights are repacked after loading, not read as stored), an MLA model
(its rope rows are permuted after loading), an FP8 KV cache (scales read at start-up) and
dummy weights (nothing to restore). A load that fails half-way loads the weights that were
served back, so the model is never left mixed; with tensor parallelism every rank must
succeed, or all roll back. A speculative draft model keeps its own weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixlm.core.kv_quant import is_fp8
from radixlm.model_executor.weight_source import (iter_safetensors_weights, path_error,
                                                  read_hf_config, resolve_model_dir)

logger = logging.getLogger(__name__)

# config.json fields that fix the parameters' shapes: a new checkpoint must agree on each.
SHAPE_FIELDS = ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                "tie_word_embeddings", "num_experts", "num_local_experts",
                "moe_intermediate_size")


@dataclass
class WeightUpdate:
    success: bool
    message: str


def _refusal(runner) -> str | None:
    if runner.config.quantization or runner.model_config.quantization:
        return "updating the weights of a quantized model is not supported"
    if runner.model_config.is_mla:
        return (f"updating the weights of an MLA model ({runner.model_config.architecture}) "
                f"is not supported")
    if is_fp8(runner.kv_dtype):
        return "updating the weights with an FP8 KV cache (--kv-cache-dtype) is not supported"
    if runner.load_format == "dummy":
        return "this server runs dummy weights (--load-format dummy), with none to restore"
    return None


def _shape_mismatch(old_dir: str, new_dir: str) -> str | None:
    old, new = read_hf_config(old_dir), read_hf_config(new_dir)
    for name in SHAPE_FIELDS:
        a, b = getattr(old, name, None), getattr(new, name, None)
        if a != b:
            return f"the checkpoint's {name} is {b!r}, the served model's {a!r}"
    return None


def update_weights_from_disk(runner, model_path: str, load_format: str | None) -> WeightUpdate:
    """Load `model_path`'s weights into `runner`'s model in place (every TP rank calls this).
    On success the runner serves from the new directory."""
    try:
        refusal = _refusal(runner)
        if refusal is None:
            new_dir, fmt = resolve_model_dir(model_path, load_format or "auto")
            if fmt == "dummy":
                refusal = "load_format dummy has no weights to load"
            else:
                refusal = _shape_mismatch(runner.hf_dir, new_dir)
    except Exception as e:      # an unreadable path, a missing config.json, ...
        refusal = f"cannot load {path_error(e, 'model_path')}"
    ok = runner.tp.min_over_ranks(int(refusal is None)) == 1
    if not ok:
        return WeightUpdate(False, refusal or "another tensor-parallel rank refused the update")
    error = _load(runner, new_dir)
    ok = runner.tp.min_over_ranks(int(error is None)) == 1
    if not ok:
        # The served weights again (this rank's load may have succeeded while another failed).
        restore = _load(runner, runner.hf_dir)
        if restore is not None:
            logger.error("restoring the served weights failed too: %s", restore)
        return WeightUpdate(False, f"loading {model_path!r} failed, the served weights were "
                                   f"restored: {error or 'on another tensor-parallel rank'}")
    runner.hf_dir, runner.load_format = new_dir, "safetensors"
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    logger.info("weights updated from %s", new_dir)
    return WeightUpdate(True, f"weights updated from {model_path}")


def _load(runner, hf_dir: str) -> str | None:
    try:
        runner.model.load_weights(iter_safetensors_weights(hf_dir))
    except Exception as e:
        logger.exception("loading weights from %s failed", hf_dir)
        # (the error's type kept; a path the message calls --model-path is this field here)
        return f"{type(e).__name__}: {str(e).replace('--model-path', 'model_path')}"
    return None
