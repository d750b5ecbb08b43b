"""Which quantization a model is served with: the `--quantization` flag read together with the
checkpoint's own `quantization_config`, checked once at startup.

Four ways in:
  --quantization fp8      on a full-precision checkpoint: FP8 weights made at load, one scale
                          per output channel;
  an FP8 checkpoint       (quant_method "fp8", with per-tensor or 128x128 block scales as
                          DeepSeek-V3 and Qwen3-FP8 ship, or "compressed-tensors" FP8 as the
                          FP8-dynamic checkpoints ship): loaded as is (the flag may say fp8);
  --quantization w4a16    on a full-precision checkpoint: 4-bit weights made at load
                          (round-to-nearest, asymmetric, one scale and zero per 128 inputs);
  an AWQ / GPTQ checkpoint (4 bits, group 32/64/128): loaded and repacked (the flag may say
                          awq / gptq).
Anything else is refused here, naming the flag or the checkpoint field, never served in another
precision than asked.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch

INT4_GROUP_SIZES = (32, 64, 128)
ONLINE_INT4_GROUP = 128
FP8_MAX = 448.0            # largest finite float8_e4m3fn value


@dataclass(frozen=True)
class QuantSpec:
    method: str                         # "fp8" | "int4"
    source: str                         # "online" (quantized at load) | the checkpoint format:
                                        # "fp8", "compressed-tensors", "awq", "gptq"
    # FP8: how the checkpoint's weight scales are laid out ("channel" for online quantization)
    fp8_scales: str = "channel"         # "tensor" | "channel" | "block"
    fp8_block: tuple[int, int] | None = None    # (rows, columns) of a scale block
    static_input_scales: bool = False   # the checkpoint carries input_scale tensors
    # INT4
    group_size: int = ONLINE_INT4_GROUP
    gptq_zero_offset: int = 0           # GPTQ v1 stores each zero point minus one
    # The checkpoint's `re:` entries of modules left unquantized (compressed-tensors `ignore`,
    # e.g. "re:.*mlp.gate$"): which modules they match is known only at load, where a
    # quantized layer they match is refused (model_executor/loader.py).
    unconverted_patterns: tuple[str, ...] = ()

    @property
    def online(self) -> bool:
        return self.source == "online"

    @property
    def name(self) -> str:
        """How logs and errors call it."""
        return {"online": "fp8" if self.method == "fp8" else "w4a16"}.get(self.source,
                                                                          self.source)


def _bad(msg: str) -> ValueError:
    return ValueError(f"--quantization: {msg}")


def resolve_quant_spec(flag: str | None, checkpoint: dict[str, Any] | None,
                       architecture: str = "?", is_moe: bool = False,
                       device: torch.device | None = None) -> QuantSpec | None:
    """The spec to serve with, or None for full precision. `checkpoint` is config.json's
    quantization_config (None when absent)."""
    spec = _spec_of(flag, checkpoint)
    if spec is None:
        return None
    if is_moe and spec.method != "fp8":
        raise _bad(f"{spec.name} is not supported yet for mixture-of-experts models "
                   f"({architecture}): their experts can be FP8 (--quantization fp8, or an "
                   f"FP8 checkpoint), not 4-bit")
    if spec.method == "fp8" and device is not None and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise _bad(f"{spec.name} needs a GPU with FP8 support (compute capability 8.9+: "
                       f"Ada, Hopper or newer); this one is {major}.{minor}")
    return spec


def _spec_of(flag: str | None, checkpoint: dict[str, Any] | None) -> QuantSpec | None:
    method = (checkpoint or {}).get("quant_method")
    if method is None:
        if flag is None:
            return None
        if flag == "fp8":
            return QuantSpec("fp8", "online")
        if flag == "w4a16":
            return QuantSpec("int4", "online")
        raise _bad(f"{flag} loads a checkpoint quantized with {flag.upper()}, and this one is "
                   f"not quantized "
                   f"(its config.json has no quantization_config); --quantization w4a16 "
                   f"quantizes it to 4 bits at load, --quantization fp8 to FP8")
    assert checkpoint is not None
    if flag == "w4a16":
        raise _bad(f"w4a16 quantizes a full-precision checkpoint at load; this one is already "
                   f"quantized (quant_method {method!r})")
    expected = {"fp8": "fp8", "compressed-tensors": "fp8", "awq": "awq", "gptq": "gptq"}
    if method not in expected:
        raise _bad(f"checkpoint quantization_config quant_method {method!r} is not supported "
                   f"(supported: fp8, compressed-tensors FP8, awq, gptq)")
    if flag is not None and flag != expected[method]:
        raise _bad(f"{flag} does not match the checkpoint's quantization_config (quant_method "
                   f"{method!r}); leave the flag out or pass --quantization {expected[method]}")
    patterns = _check_unconverted(checkpoint.get("modules_to_not_convert")
                                  or checkpoint.get("ignore"))
    if method == "fp8":
        spec = _hf_fp8(checkpoint)
    elif method == "compressed-tensors":
        spec = _compressed_tensors_fp8(checkpoint)
    else:
        spec = _int4(method, checkpoint)
    return dataclasses.replace(spec, unconverted_patterns=patterns)


# Modules a checkpoint may list as left in full precision because they are so here too: the
# LM head and embeddings, MoE routers (`mlp.gate`, Qwen2-MoE's shared_expert_gate) and norms.
_ALWAYS_FULL_PRECISION = ("lm_head", "embed_tokens", "gate", "shared_expert_gate")


def _check_unconverted(names: list[str] | None) -> tuple[str, ...]:
    """Layers a checkpoint leaves in full precision. Those above always are here; any other
    linear layer would need a per-layer method, which the loader does not do. Returns the
    `re:` entries (checked against the real module names at load)."""
    patterns = tuple(n.removeprefix("re:") for n in names or () if n.startswith("re:"))
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise _bad(f"checkpoint ignore entry 're:{p}' is not a valid pattern: {e}")
    others = [n for n in names or () if not n.startswith("re:")
              and n.split(".")[-1] not in _ALWAYS_FULL_PRECISION
              and "norm" not in n.split(".")[-1]]
    if others:
        raise _bad(f"checkpoints that leave some linear layers unquantized are not supported "
                   f"yet (modules_to_not_convert / ignore: {others[:4]})")
    return patterns


def _hf_fp8(cfg: dict[str, Any]) -> QuantSpec:
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _bad(f"FP8 checkpoint format {fmt!r} is not supported (e4m3 only)")
    static = cfg.get("activation_scheme", "dynamic") == "static"
    block = cfg.get("weight_block_size")
    if block is None:
        return QuantSpec("fp8", "fp8", fp8_scales="tensor", static_input_scales=static)
    return QuantSpec("fp8", "fp8", fp8_scales="block",
                     fp8_block=_scale_block(block, "FP8 weight_block_size"),
                     static_input_scales=static)


def _scale_block(block: Any, what: str) -> tuple[int, int]:
    """The kernels step through K in tiles that divide a scale block, or span whole ones:
    only powers of two are served (a 24-wide block would be read with the wrong scales)."""
    if len(block) != 2 or any(int(b) < 16 or int(b) & (int(b) - 1) for b in block):
        raise _bad(f"{what} {block} is not supported (two powers of two >= 16)")
    return int(block[0]), int(block[1])


def _compressed_tensors_fp8(cfg: dict[str, Any]) -> QuantSpec:
    """compressed-tensors with FP8 weights (float, 8 bits), the only scheme served from it."""
    groups = list((cfg.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise _bad(f"compressed-tensors checkpoints with {len(groups)} config groups are not "
                   f"supported (one FP8 group)")
    weights = groups[0].get("weights") or {}
    if weights.get("type") != "float" or weights.get("num_bits") != 8:
        raise _bad(f"compressed-tensors weights {weights.get('type')}/{weights.get('num_bits')} "
                   f"bits are not supported (FP8 float/8 only)")
    strategy = weights.get("strategy", "tensor")
    acts = groups[0].get("input_activations") or {}
    static = bool(acts) and not acts.get("dynamic", True)
    if strategy in ("tensor", "channel"):
        return QuantSpec("fp8", "compressed-tensors", fp8_scales=strategy,
                         static_input_scales=static)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        return QuantSpec("fp8", "compressed-tensors", fp8_scales="block",
                         fp8_block=_scale_block(block, "compressed-tensors block_structure"),
                         static_input_scales=static)
    raise _bad(f"compressed-tensors FP8 strategy {strategy!r} is not supported "
               f"(tensor, channel, block)")


def _int4(method: str, cfg: dict[str, Any]) -> QuantSpec:
    bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
    group = int(cfg.get("group_size", cfg.get("q_group_size", 128)))
    if bits != 4:
        raise _bad(f"{method} checkpoints with {bits}-bit weights are not supported (4 bits)")
    if group not in INT4_GROUP_SIZES:
        raise _bad(f"{method} group_size {group} is not supported "
                   f"(one of {INT4_GROUP_SIZES})")
    if method == "awq":
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise _bad(f"AWQ version {version!r} is not supported (gemm)")
        if not cfg.get("zero_point", True):
            raise _bad("AWQ checkpoints without zero points are not supported")
        return QuantSpec("int4", "awq", group_size=group)
    if cfg.get("desc_act"):
        raise _bad("GPTQ checkpoints with desc_act (act-order) are not supported; use one "
                   "quantized with desc_act false")
    fmt = cfg.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise _bad(f"GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return QuantSpec("int4", "gptq", group_size=group,
                     gptq_zero_offset=1 if fmt == "gptq" else 0)
