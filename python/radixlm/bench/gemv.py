"""`radixlm bench gemv`: batch-1 linear layers, F.linear (cuBLAS) against the Triton GEMV.

Every shape a rank multiplies in a Llama decode step (qkv, o, gate_up, down and the LM head) at
the tensor-parallel widths served (Llama-3.2-1B at TP1, Llama-3.1-8B at TP1/2/4, Llama-3.1-70B
at TP4/8), for one row of x. Each timing is one call inside a CUDA graph of many,
each call on a different copy of the weight so that together they overflow the L2 cache (a decode
step reads every weight once: L2 hits would flatter both sides). Reported: microseconds, the
weight bytes read per microsecond against the copy bandwidth measured in the same run, and the
Triton kernel's largest difference from an fp32 product (and cuBLAS's), where the default rule
(`gemv_tiles`) takes the kernel.

  --sweep   also time every tile in a grid and report the fastest per shape (how the default
            rule in layers/kernels/gemv_kernels.py was chosen).

    radixlm bench gemv --sweep
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from radixlm.bench.common import default_output_path, environment, print_summary, write_json

# (model, tp) -> hidden, q width, kv width, intermediate, vocab
MODELS = {"llama-3.2-1b": (2048, 2048, 512, 8192, 128256),
          "llama-3.1-8b": (4096, 4096, 1024, 14336, 128256),
          "llama-3.1-70b": (8192, 8192, 1024, 28672, 128256)}
SERVED = [("llama-3.2-1b", 1), ("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-8b", 4),
          ("llama-3.1-70b", 4), ("llama-3.1-70b", 8)]
L2_OVERFLOW_BYTES = 512 << 20


def rank_shapes(model: str, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer one rank of a TP group multiplies."""
    h, q, kv, inter, vocab = MODELS[model]
    kv_rank = max(kv // tp, 128)         # KV heads replicate past tp = their count
    return {"qkv": (q // tp + 2 * kv_rank, h), "o": (h, q // tp),
            "gate_up": (2 * inter // tp, h), "down": (h, inter // tp),
            "lm_head": (vocab // tp, h)}


def _sweep_grid() -> list:
    from radixlm.layers.kernels.gemv_kernels import GemvTiles
    return [GemvTiles(bn, bk, warps) for bn in (2, 4, 8) for bk in (512, 1024, 2048)
            for warps in (4, 8)]


def copies_past_l2(make: Callable[[], Any], nbytes: int) -> list:
    """Enough results of make() (weights of `nbytes` each) to overflow the L2 cache together."""
    return [make() for _ in range(max(1, -(-L2_OVERFLOW_BYTES // nbytes)))]


def timed_over_copies(op: Callable[[Any], Any], copies: list) -> float:
    """Microseconds of one op(copy) inside a CUDA graph of calls that each take the next copy
    (a decode step reads each weight once: L2 hits would flatter every side)."""
    from radixlm.bench.fused_ops import time_graph_us
    cycle = itertools.cycle(copies)
    return time_graph_us(lambda: op(next(cycle)), iters=20,
                         calls=max(len(copies), 8))


def run_shape(name: str, n: int, k: int, sweep: bool, bandwidth: float) -> dict:
    from radixlm.layers.kernels.gemv_kernels import gemv, gemv_tiles
    nbytes = n * k * 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = copies_past_l2(lambda: torch.randn(n, k, device="cuda", generator=gen)
                        .mul_(k ** -0.5).to(torch.bfloat16), nbytes)
    copies = len(ws)
    x = torch.randn(1, k, device="cuda", generator=gen, dtype=torch.bfloat16)

    def timed(op: Callable[[torch.Tensor], Any]) -> float:
        return timed_over_copies(op, ws)

    ref_us = timed(lambda w: F.linear(x, w))
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "weight_copies": copies,
                           "f_linear_us": ref_us,
                           "f_linear_of_copy_bw": nbytes / ref_us / 1e6 / bandwidth}
    line = (f"{name:26s} {n:6d} x {k:5d} F.linear {ref_us:7.1f} us "
            f"({row['f_linear_of_copy_bw']:.0%})")
    tiles = gemv_tiles(1, n, k)
    if tiles is not None:
        us = timed(lambda w: gemv(x, w, None, tiles))
        ref = F.linear(x.float(), ws[0].float())
        row.update(gemv_us=us, gemv_tiles=tiles.__dict__, speedup=ref_us / us,
                   gemv_of_copy_bw=nbytes / us / 1e6 / bandwidth,
                   gemv_max_err=(gemv(x, ws[0], None, tiles).float() - ref).abs().max().item(),
                   f_linear_max_err=(F.linear(x, ws[0]).float() - ref).abs().max().item())
        line += (f"  gemv {us:7.1f} us ({row['gemv_of_copy_bw']:.0%}) x{row['speedup']:.2f} "
                 f"err {row['gemv_max_err']:.1e} (cuBLAS {row['f_linear_max_err']:.1e})")
    if sweep:
        timings = [{**t.__dict__, "us": timed(lambda w, t=t: gemv(x, w, None, t))}
                   for t in _sweep_grid()]
        best = min(timings, key=lambda r: r["us"])
        row.update(best_us=best["us"], best_speedup=ref_us / best["us"], sweep=timings,
                   best_tiles={key: v for key, v in best.items() if key != "us"},
                   f_linear_again_us=timed(lambda w: F.linear(x, w)))
        line += f"  best {best['us']:7.1f} x{row['best_speedup']:.2f} {row['best_tiles']}"
    print(line, flush=True)
    ws.clear()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="radixlm bench gemv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="time a grid of tiles per shape")
    ap.add_argument("--only", nargs="*", default=None,
                    help="model:tp pairs to run (default: all of SERVED)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("radixlm bench gemv needs a CUDA GPU", file=sys.stderr)
        return 2
    served = SERVED
    if args.only:
        served = [(m, int(t)) for m, t in (s.split(":") for s in args.only)]
    from radixlm.bench.one_batch import copy_bandwidth
    bandwidth = copy_bandwidth(torch.device("cuda")) / 1e12      # TB/s, read + write
    print(f"copy bandwidth {bandwidth:.2f} TB/s", flush=True)
    rows = []
    for model, tp in served:
        for layer, (n, k) in rank_shapes(model, tp).items():
            rows.append(run_shape(f"{model} tp{tp} {layer}", n, k, args.sweep, bandwidth))
    with_gemv = [r for r in rows if "gemv_us" in r]
    summary = {"copy_bandwidth_tb_s": bandwidth,
               "gemv_faster": sum(r["speedup"] > 1 for r in with_gemv),
               "gemv_shapes": len(with_gemv)}
    path = args.output or default_output_path("gemv")
    write_json(path, {"environment": environment("cuda"), "args": vars(args),
                      "summary": summary, "rows": rows})
    print_summary(f"gemv: faster than F.linear on {summary['gemv_faster']} of "
                  f"{summary['gemv_shapes']} shapes; results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
