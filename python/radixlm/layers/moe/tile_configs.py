"""Tile configs for the fused MoE GEMM: tuned per GPU and shape where a file says so, else a
heuristic.

`radixlm bench moe-tune` (bench/moe_tune.py) times a grid of tiles for one GEMM shape at
several batch sizes and writes `configs/<gpu>/E<E>_N<N>_K<K>_<dtype>.json`:

    {"1": {"block_m": 16, "block_n": 64, ...}, "64": {...}, ...}

FP8 expert weights (layers/moe/fp8_experts.py) have their own files, `..._<dtype>_fp8w.json`
(`bench moe-tune --fp8`): half the bytes per tile move the best tiles.

keyed by the number of tokens x top_k pairs it was tuned at. A lookup takes the entry tuned at
the nearest pair count. Files live in the package, so a tuned shape ships with the wheel;
RADIXLM_MOE_CONFIG_DIR points somewhere else (tuning your own GPU without a reinstall).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict
from pathlib import Path

import torch

from radixlm.layers.moe.fused_moe_kernel import MoETileConfig, default_tile_config

PACKAGE_DIR = Path(__file__).parent / "configs"


def gpu_slug(device: torch.device) -> str:
    """'NVIDIA H200' -> 'nvidia_h200' (the directory of that GPU's tuned files)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def config_file_name(num_experts: int, n: int, k: int, dtype: torch.dtype,
                     fp8_weights: bool = False) -> str:
    suffix = "_fp8w" if fp8_weights else ""
    return f"E{num_experts}_N{n}_K{k}_{str(dtype).removeprefix('torch.')}{suffix}.json"


def config_dir() -> Path:
    return Path(os.environ.get("RADIXLM_MOE_CONFIG_DIR") or PACKAGE_DIR)


@functools.lru_cache(maxsize=256)
def _load(directory: str, slug: str, name: str) -> dict[int, MoETileConfig] | None:
    path = Path(directory) / slug / name
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {int(pairs): MoETileConfig(**cfg) for pairs, cfg in raw.items()}


@functools.lru_cache(maxsize=1024)
def tile_config_for(num_pairs: int, num_experts: int, n: int, k: int, dtype: torch.dtype,
                    device: torch.device, fp8_weights: bool = False) -> MoETileConfig:
    """Memoised: eager steps ask twice per MoE layer (RADIXLM_MOE_CONFIG_DIR is read on the
    first ask for a shape). `dtype`: the activations'; `fp8_weights`: the experts are FP8."""
    tuned = _load(str(config_dir()), gpu_slug(device),
                  config_file_name(num_experts, n, k, dtype, fp8_weights))
    if tuned:
        nearest = min(tuned, key=lambda p: abs(p - num_pairs))
        return tuned[nearest]
    return default_tile_config(num_pairs, num_experts, n, k, dtype)


def write_tuned(path: Path, configs: dict[int, MoETileConfig]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({str(p): asdict(c) for p, c in sorted(configs.items())},
                               indent=1) + "\n")
