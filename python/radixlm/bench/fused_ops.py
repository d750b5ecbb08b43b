"""`python -m radixlm.bench.fused_ops`: the fused Triton small ops (RMSNorm, RMSNorm + residual,
SiLU-and-mul, rotary on q/k views of a fused qkv output) against their PyTorch fallback, through
the same layer calls the models make, at Llama-3.2-1B and Llama-3.1-8B shapes. CUDA only.

Each (model, op, tokens) is timed two ways, both with CUDA events, median of --iters after
--warmup:
  * eager: events around every single call, so host launch overhead that the GPU waits for is
    counted (what an eager forward pays; at small T it dominates both paths);
  * graph: --graph-calls calls captured in one CUDA graph, events around each replay, divided by
    the calls: GPU time alone, as a captured decode step sees it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Sequence

import torch

from radixlm.bench.common import (FUSED_OPS_KNOB, FusedOpsFallback, default_output_path,
                                  environment, graph_seconds_per_call, median, print_summary,
                                  write_json)

KNOB = FUSED_OPS_KNOB

# The shapes that matter here, as in benchmarks/configs/*/config.json.
MODELS: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": dict(hidden=2048, intermediate=8192, heads=32, kv_heads=8, head_dim=64,
                         eps=1e-5, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    "llama-3.1-8b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
                         eps=1e-5, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
}
OPS = ("rmsnorm", "rmsnorm_residual", "silu_and_mul", "rotary")
MAX_POSITION = 131072


def time_us(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median microseconds of one call, CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return 1e3 * median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_graph_us(fn: Callable[[], Any], iters: int, calls: int) -> float:
    """Median microseconds of one call inside a CUDA graph of `calls` calls."""
    return graph_seconds_per_call(fn, graph_calls=calls, repeats=iters) * 1e6


def _case(op: str, m: dict[str, Any], t: int, dtype: torch.dtype, layers: dict[str, Any],
          g: torch.Generator):
    """(call, bytes the fused kernel moves, tensors to compare) for one op at t tokens."""
    from radixlm.layers.activation import silu_and_mul

    dev, size = "cuda", torch.finfo(dtype).bits // 8
    h, i = m["hidden"], m["intermediate"]
    if op in ("rmsnorm", "rmsnorm_residual"):
        norm = layers["norm"]
        x = torch.randn(t, h, generator=g, device="cpu").to(device=dev, dtype=dtype)
        if op == "rmsnorm":
            return (lambda: norm(x)), 2 * t * h * size
        r = torch.randn(t, h, generator=g, device="cpu").to(device=dev, dtype=dtype)
        return (lambda: norm(x, r)), 4 * t * h * size
    if op == "silu_and_mul":
        x = torch.randn(t, 2 * i, generator=g, device="cpu").to(device=dev, dtype=dtype)
        return (lambda: silu_and_mul(x)), 3 * t * i * size
    rope, hq, hk, d = layers["rope"], m["heads"], m["kv_heads"], m["head_dim"]
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g, device="cpu").to(device=dev,
                                                                          dtype=dtype)
    positions = torch.randint(0, MAX_POSITION, (t,), generator=g).to(dev)
    q, k, _ = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k = q.reshape(t, hq, d), k.reshape(t, hk, d)
    # In place on the fused path: repeated calls keep rotating the same data (norms unchanged).
    return (lambda: rope(positions, q, k)), 2 * t * (hq + hk) * d * size


def _max_diff(call: Callable[[], Any]) -> float:
    """Max abs difference, fused vs fallback, on the same inputs (the fallback runs first: it
    writes nothing, while fused rotary rotates q/k in place)."""
    with FusedOpsFallback(True):
        ref = call()
    ref = [t.clone() for t in (ref if isinstance(ref, tuple) else (ref,))]
    with FusedOpsFallback(False):
        out = call()
    out = out if isinstance(out, tuple) else (out,)
    return max((a.float() - b.float()).abs().max().item() if a.numel() else 0.0
               for a, b in zip(out, ref))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from radixlm.core.model_config import RopeScaling
    from radixlm.layers.norm import RMSNorm
    from radixlm.layers.rotary import RotaryEmbedding

    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    rows = []
    for name in args.models:
        m = MODELS[name]
        norm = RMSNorm(m["hidden"], m["eps"])
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(m["hidden"], generator=g))
        layers = {"norm": norm.to(device="cuda", dtype=dtype),
                  "rope": RotaryEmbedding(m["head_dim"], MAX_POSITION, m["rope_theta"],
                                          RopeScaling.from_hf(m["rope_scaling"])).to("cuda")}
        for t in args.tokens:
            for op in args.ops:
                call, nbytes = _case(op, m, t, dtype, layers, g)
                diff = _max_diff(call)
                with FusedOpsFallback(True):
                    torch_us = time_us(call, args.warmup, args.iters)
                    torch_graph_us = time_graph_us(call, args.iters,
                                                   args.graph_calls)
                with FusedOpsFallback(False):
                    fused_us = time_us(call, args.warmup, args.iters)
                    fused_graph_us = time_graph_us(call, args.iters,
                                                   args.graph_calls)
                rows.append(dict(model=name, op=op, tokens=t, dtype=args.dtype,
                                 torch_us=torch_us, fused_us=fused_us,
                                 speedup=torch_us / fused_us,
                                 torch_graph_us=torch_graph_us, fused_graph_us=fused_graph_us,
                                 graph_speedup=torch_graph_us / fused_graph_us,
                                 fused_bytes=nbytes,
                                 fused_graph_gbps=nbytes / fused_graph_us / 1e3,
                                 max_abs_diff=diff))
                print(f"{name:13s} {op:17s} T={t:<5d} eager {torch_us:8.1f} -> {fused_us:8.1f} us"
                      f"  graph {torch_graph_us:8.1f} -> {fused_graph_us:8.1f} us", flush=True)
                torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'model':13s} {'op':17s} {'T':>5s} | {'eager us':>8s} {'fused':>8s} {'x':>6s} | "
            f"{'graph us':>8s} {'fused':>8s} {'x':>6s} {'GB/s':>7s} | {'max diff':>8s}")
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['model']:13s} {r['op']:17s} {r['tokens']:5d} | {r['torch_us']:8.1f} "
              f"{r['fused_us']:8.1f} {r['speedup']:5.2f}x | {r['torch_graph_us']:8.1f} "
              f"{r['fused_graph_us']:8.1f} {r['graph_speedup']:5.2f}x "
              f"{r['fused_graph_gbps']:7.0f} | {r['max_abs_diff']:8.2g}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m radixlm.bench.fused_ops",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 256, 8192])
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--graph-calls", type=int, default=10,
                   help="calls per captured CUDA graph in the graph timing")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_ops: needs CUDA (the fused kernels only run on the GPU)")
        return 2
    from radixlm.layers.kernels import triton_available
    if not triton_available():
        print("fused_ops: Triton does not import; the fused kernels cannot run")
        return 2
    if os.environ.get(KNOB):
        print(f"fused_ops: note: {KNOB} is set in the environment; ignored here")

    rows = run(args)
    print_table(rows)
    result = {
        "benchmark": "fused_ops",
        "config": {k: v for k, v in vars(args).items() if k != "output"},
        "models": {name: MODELS[name] for name in args.models},
        "timing": f"CUDA events, median of {args.iters} after {args.warmup} warm-up; eager: "
                  f"around each call; graph: around each replay of {args.graph_calls} captured "
                  f"calls, divided by {args.graph_calls}",
        "results": rows,
        "environment": environment("cuda"),
        "argv": list(argv) if argv is not None else None,
    }
    path = write_json(args.output or default_output_path("fused_ops"), result)
    eager = sorted(r["speedup"] for r in rows)
    graph = sorted(r["graph_speedup"] for r in rows)
    print_summary(f"fused ops: {len(rows)} cases, speedup over PyTorch: eager median "
                  f"{median(eager):.2f}x ({eager[0]:.2f}-{eager[-1]:.2f}x), CUDA graph median "
                  f"{median(graph):.2f}x ({graph[0]:.2f}-{graph[-1]:.2f}x) -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
