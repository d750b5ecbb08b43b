"""`radixlm bench moe-tune`: time a grid of tile configs for the fused MoE GEMMs and write the
fastest per batch size where layers/moe/tile_configs.py looks for them.

For each expert shape (experts, top_k, hidden, intermediate) and batch size, the gate_up GEMM
([pairs, 2I] from [T, H]) is tuned over the whole grid; it fixes BLOCK_M (both GEMMs walk the
same expert-aligned blocks), then the down GEMM ([pairs, H] from [pairs, I]) is tuned over the
rest of the grid at that BLOCK_M. The files go to --output-dir/<gpu>/ (default: the package's
configs directory, so a tuned shape ships with the code; commit them).

    radixlm bench moe-tune --shapes qwen3-30b-a3b,deepseek-v2-lite --batch-sizes 1,16,64,256

`--fp8` tunes FP8 experts with 128x128 block scales (as FP8 checkpoints ship them; online FP8's
per-row scales use the same files), over a grid with deeper pipelines.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Sequence

import torch

from radixlm.bench.common import print_summary
from radixlm.bench.moe_common import EXPERT_SHAPES, time_fn

# Narrow N tiles matter at small batches: with one row per expert, a wide tile leaves too few
# programs to keep every SM streaming weights.
GRID = dict(block_m=(16, 32, 64), block_n=(32, 64, 128), block_k=(64, 128), num_warps=(4, 8),
            num_stages=(3, 4))


# FP8 tiles carry half the bytes: deeper pipelines keep as many in flight. BLOCK_K stays within
# one 128-wide scale block.
FP8_STAGES = (3, 4, 5)


def _configs(block_m: int | None = None, fp8: bool = False):
    from radixlm.layers.moe.fused_moe_kernel import MoETileConfig
    ms = (block_m,) if block_m else GRID["block_m"]
    stages = FP8_STAGES if fp8 else GRID["num_stages"]
    for m, n, k, w, s in itertools.product(ms, GRID["block_n"], GRID["block_k"],
                                           GRID["num_warps"], stages):
        yield MoETileConfig(m, n, k, 8 if m >= 32 else 1, w, s)


def _best(run, configs, device) -> tuple[object, float]:
    best, best_s = None, float("inf")
    for cfg in configs:
        try:
            s = time_fn(lambda: run(cfg), device, iters=10)
        except Exception:   # out of shared memory / registers for this tile: skip it
            continue
        if s < best_s:
            best, best_s = cfg, s
    return best, best_s


def tune_shape(name: str, batch_sizes: list[int], device: torch.device,
               fp8: bool = False) -> tuple[dict, dict]:
    from radixlm.layers.moe import fused_moe_kernel as kern
    from radixlm.layers.moe.topk import RoutingConfig, select_experts

    experts, top_k, hidden, inter = EXPERT_SHAPES[name]
    dt = torch.bfloat16
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dt) * 0.02
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=dt) * 0.02
    scaled: dict[str, dict] = {"up": {}, "down": {}}
    if fp8:
        from radixlm.layers.moe.fp8_experts import quantize_experts
        block = (128, 128)
        w13, s13 = quantize_experts(w13, block)
        w2, s2 = quantize_experts(w2, block)
        scaled = {"up": dict(b_scale=s13, scale_block=block),
                  "down": dict(b_scale=s2, scale_block=block)}
    up_best, down_best = {}, {}
    for bs in batch_sizes:
        x = torch.randn(bs, hidden, device=device, dtype=dt)
        w, ids = select_experts(torch.randn(bs, experts, device=device),
                                RoutingConfig(top_k, renormalize=True))
        pairs_n = bs * top_k
        gate_up = torch.empty(pairs_n, 2 * inter, device=device, dtype=dt)
        act = torch.randn(pairs_n, inter, device=device, dtype=dt)
        down = torch.empty(pairs_n, hidden, device=device, dtype=dt)
        aligned: dict[int, object] = {}

        def pairs(block_m):
            if block_m not in aligned:
                aligned[block_m] = kern.align_pairs_to_blocks(ids, experts, block_m)
            return aligned[block_m]

        up_cfg, up_s = _best(lambda c: kern.grouped_gemm(x, w13, gate_up, pairs(c.block_m),
                                                          top_k, c, **scaled["up"]),
                             _configs(fp8=fp8), device)
        if up_cfg is None:
            raise RuntimeError(f"{name} bs {bs}: no tile of the grid ran on this GPU")
        down_cfg, down_s = _best(
            lambda c: kern.grouped_gemm(act, w2, down, pairs(c.block_m), 1, c,
                                        pair_weights=w.reshape(-1), **scaled["down"]),
            _configs(up_cfg.block_m, fp8), device)
        if down_cfg is None:
            raise RuntimeError(f"{name} bs {bs}: no down-projection tile ran on this GPU")
        up_best[pairs_n], down_best[pairs_n] = up_cfg, down_cfg
        print(f"tune {name} bs {bs}: gate_up {up_s * 1e6:.0f} us {up_cfg}; down "
              f"{down_s * 1e6:.0f} us {down_cfg}", flush=True)
    return up_best, down_best


def main(argv: Sequence[str] | None = None) -> int:
    from radixlm.layers.moe.tile_configs import (PACKAGE_DIR, config_file_name, gpu_slug,
                                                 write_tuned)

    p = argparse.ArgumentParser(prog="radixlm bench moe-tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(EXPERT_SHAPES))
    p.add_argument("--batch-sizes", default="1,16,64,256")
    p.add_argument("--output-dir", default=str(PACKAGE_DIR))
    p.add_argument("--fp8", action="store_true",
                   help="tune FP8 experts (128x128 block scales): files *_fp8w.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    device = torch.device("cuda")
    written = []
    for name in args.shapes.split(","):
        if name not in EXPERT_SHAPES:
            p.error(f"--shapes: unknown {name!r}; choose from {sorted(EXPERT_SHAPES)}")
        experts, _, hidden, inter = EXPERT_SHAPES[name]
        up, down = tune_shape(name, [int(b) for b in args.batch_sizes.split(",")], device,
                              args.fp8)
        out = Path(args.output_dir) / gpu_slug(device)
        for (n, k), best in (((2 * inter, hidden), up), ((hidden, inter), down)):
            path = out / config_file_name(experts, n, k, torch.bfloat16, args.fp8)
            write_tuned(path, best)
            written.append(str(path))
    print_summary("bench moe-tune wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
