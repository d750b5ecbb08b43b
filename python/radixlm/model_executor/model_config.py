"""ModelConfig: the model facts the engine needs, read once from the HF config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPE_NAMES = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class ModelConfig:
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

    @classmethod
    def from_hf(cls, hf_config, context_length: int | None,
                extra_eos: tuple[int, ...] = ()) -> "ModelConfig":
        max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
        if context_length is not None and context_length > max_pos:
            raise ValueError(f"--context-length {context_length} exceeds the model's "
                             f"max_position_embeddings ({max_pos})")
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        eos = getattr(hf_config, "eos_token_id", None)
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        eos_ids += [e for e in extra_eos if e not in eos_ids]
        return cls(hf_config=hf_config,
                   architecture=(getattr(hf_config, "architectures", None) or ["?"])[0],
                   num_layers=hf_config.num_hidden_layers, num_attention_heads=heads,
                   num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
                   head_dim=head_dim, hidden_size=hf_config.hidden_size,
                   vocab_size=hf_config.vocab_size, context_len=context_length or max_pos,
                   eos_token_ids=tuple(eos_ids))


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
