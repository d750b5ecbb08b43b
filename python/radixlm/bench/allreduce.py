"""`radixlm bench allreduce`: where a tensor-parallel all-reduce's time goes, per message size.

One process per GPU (as the engine's ranks: all of them see every GPU and pick their own), for
each world size in --tp-sizes and each message size: NCCL called eagerly, NCCL inside a CUDA
graph (how decode runs it), and the engine's symmetric-memory one-shot path inside a graph
(distributed/custom_all_reduce.py), each checked against NCCL's sum on integer-valued data (exact
in bf16). Times are per all-reduce: a graph of --ops-per-graph of them, replayed --repeats times
after a warm-up, median over replays, the slowest rank's median reported (a collective ends when
its last rank does). Also reports which path the engine's size limit picks and the time it saves,
and, for messages of whole --hidden rows, the all-reduce with the residual add and RMSNorm after
it: one-shot then the RMSNorm kernel (two kernels) against the fused kernel
(distributed/fused_all_reduce_norm.py), whose results are checked against the two kernels'.

    python -m radixlm.bench.allreduce --tp-sizes 2 4
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Sequence

import torch

from radixlm.bench.common import (capture_graph, default_output_path, environment, print_summary,
                                  write_json)
from radixlm.utils.server_process import free_port

DEFAULT_SIZES_KB = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _graph_us(fn: Callable[[], Any], ops: int, repeats: int) -> float:
    """Median microseconds per call of `fn` captured `ops` times in one CUDA graph."""
    graph = capture_graph(fn, ops)
    return _median_us(graph.replay, repeats) / ops


def _eager_us(fn: Callable[[], Any], ops: int, repeats: int) -> float:
    def many():
        for _ in range(ops):
            fn()
    many()
    return _median_us(many, repeats) / ops


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    import torch.distributed as dist
    times = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2]


def _rank_main(rank: int, world: int, port: int, ns: argparse.Namespace, queue: Any) -> None:
    from radixlm import envs
    envs.keep_multicast_off()
    import torch.distributed as dist

    from radixlm.distributed.custom_all_reduce import (SymmMemAllReduce, one_shot_limit,
                                                       two_shot_limit)
    from radixlm.distributed.fused_all_reduce_norm import FusedAllReduceRMSNorm
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    group = dist.group.WORLD
    device = torch.device("cuda", rank)
    max_bytes = max(ns.sizes_kb) * 1024
    try:
        # The engine's paths (for `engine_path`), and each forced alone for its timings.
        engine = SymmMemAllReduce.create(group, world, device)
        fast: SymmMemAllReduce | None = SymmMemAllReduce.create(group, world, device, max_bytes,
                                                                0)
        two: SymmMemAllReduce | None = SymmMemAllReduce.create(group, world, device, 0,
                                                               max_bytes)
        fused: FusedAllReduceRMSNorm | None = FusedAllReduceRMSNorm(
            group.group_name, world, rank, device, min(max_bytes, ns.fused_max_kb * 1024))
        fused.allocate()
        fused.rendezvous()
        fast_error = None
    except Exception as e:   # reported, and the NCCL figures still come
        engine = fast = two = fused = None
        fast_error = f"{type(e).__name__}: {e}"
    rows = []
    for kb in ns.sizes_kb:
        n = kb * 1024 // 2
        gen = torch.Generator(device=device).manual_seed(rank)
        data = torch.randint(-8, 8, (n,), device=device, generator=gen).to(torch.bfloat16)
        want = data.clone()
        dist.all_reduce(want)
        x = data.clone()
        row: dict[str, Any] = {"kb": kb,
                               "engine_path": engine.path(data) if engine else "nccl"}
        row["nccl_eager_us"] = _eager_us(lambda: dist.all_reduce(x), ns.ops_per_graph,
                                         ns.repeats)
        row["nccl_graph_us"] = _graph_us(lambda: dist.all_reduce(x), ns.ops_per_graph,
                                         ns.repeats)
        if fast is not None:
            got = fast.all_reduce(data)
            row["one_shot_correct"] = bool(torch.equal(got, want))
            row["one_shot_graph_us"] = _graph_us(lambda: fast.all_reduce(data),
                                                 ns.ops_per_graph, ns.repeats)
        if two is not None and two.path(data) == "two_shot":
            row["two_shot_correct"] = bool(torch.equal(two.all_reduce(data.clone()), want))
            y = data.clone()
            row["two_shot_graph_us"] = _graph_us(lambda: two.all_reduce(y), ns.ops_per_graph,
                                                 ns.repeats)
        if fused is not None and n % ns.hidden == 0 and kb * 1024 <= fused.max_bytes:
            row.update(_norm_figures(fast, fused, data.view(n // ns.hidden, ns.hidden),
                                     want.view(n // ns.hidden, ns.hidden), ns))
        rows.append(row)
    # The slowest rank's time per figure.
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        worst = []
        for per_size in zip(*gathered):
            merged = dict(per_size[0])
            for key in merged:
                if key.endswith("_us"):
                    merged[key] = max(r[key] for r in per_size)
            for key in ("one_shot_correct", "two_shot_correct", "fused_norm_correct"):
                if key in merged:
                    merged[key] = all(r.get(key, False) for r in per_size)
            worst.append(merged)
        queue.put({"world_size": world, "one_shot_error": fast_error,
                   "one_shot_max_bytes": one_shot_limit(world),
                   "two_shot_max_bytes": two_shot_limit(world), "sizes": worst})
    dist.barrier()
    dist.destroy_process_group()


def _norm_figures(fast: Any, fused: Any, x: torch.Tensor, summed: torch.Tensor,
                  ns: argparse.Namespace) -> dict[str, Any]:
    """All-reduce + residual add + RMSNorm of `x` ([rows, hidden]): one-shot then the RMSNorm
    kernel vs the fused kernel, timed in graphs; the fused results checked against the RMSNorm
    kernel's on the exact sum `summed` (the new residual equal, the output within 1e-2)."""
    from radixlm.layers.kernels import norm_kernels
    gen = torch.Generator(device=x.device).manual_seed(1)   # the same on every rank
    residual = torch.randn(x.shape, device=x.device, generator=gen).to(x.dtype)
    weight = torch.rand(x.shape[1], device=x.device, generator=gen).to(x.dtype)
    want, want_res = norm_kernels.rms_norm(summed, weight, 1e-6, residual)
    got, got_res = fused(x, residual, weight, 1e-6)
    ok = bool(torch.equal(got_res, want_res)
              and torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2))
    return {"rows": x.shape[0], "fused_norm_correct": ok,
            "one_shot_norm_graph_us": _graph_us(
                lambda: norm_kernels.rms_norm(fast.all_reduce(x), weight, 1e-6, residual),
                ns.ops_per_graph, ns.repeats),
            "fused_norm_graph_us": _graph_us(lambda: fused(x, residual, weight, 1e-6),
                                             ns.ops_per_graph, ns.repeats)}


def run(ns: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp
    results = []
    for world in ns.tp_sizes:
        if world > torch.cuda.device_count():
            results.append({"world_size": world, "skipped": "fewer GPUs"})
            continue
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=_rank_main, args=(r, world, port, ns, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        result = queue.get(timeout=600)
        for p in procs:
            p.join(timeout=120)
        results.append(result)
    return {"benchmark": "allreduce", "environment": environment("cuda"),
            "args": {k: v for k, v in vars(ns).items() if k != "output"}, "results": results}


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(res: dict[str, Any]) -> str:
    lines = ["tp  size_kb  nccl_eager_us  nccl_graph_us  one_shot_us  two_shot_us    engine  ok"
             "  one_shot+norm_us  fused_norm_us"]
    for r in res["results"]:
        if "sizes" not in r:
            lines.append(f"{r['world_size']:>2}  skipped ({r.get('skipped')})")
            continue
        if r.get("one_shot_error"):
            lines.append(f"{r['world_size']:>2}  one-shot unavailable: {r['one_shot_error']}")
        for s in r["sizes"]:
            one, two = s.get("one_shot_graph_us"), s.get("two_shot_graph_us")
            ok = all(s.get(k) is not False
                     for k in ("one_shot_correct", "two_shot_correct", "fused_norm_correct"))
            unfused, fused = s.get("one_shot_norm_graph_us"), s.get("fused_norm_graph_us")
            lines.append(f"{r['world_size']:>2}  {s['kb']:>7}  {s['nccl_eager_us']:>13.1f}  "
                         f"{s['nccl_graph_us']:>13.1f}  "
                         f"{_us(one):>11}  {_us(two):>11}  {s['engine_path']:>8}  {ok!s:>5}  "
                         f"{_us(unfused):>16}  {_us(fused):>13}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench allreduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp-sizes", type=int, nargs="+", default=[2])
    p.add_argument("--sizes-kb", type=int, nargs="+", default=list(DEFAULT_SIZES_KB),
                   help="message sizes in KiB (bf16)")
    p.add_argument("--hidden", type=int, default=4096,
                   help="row size of the all-reduce + RMSNorm figures (8B: 4096, 70B: 8192)")
    p.add_argument("--fused-max-kb", type=int, default=1024,
                   help="largest message the fused all-reduce + RMSNorm is timed at")
    p.add_argument("--ops-per-graph", type=int, default=20)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--output", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("radixlm bench allreduce: needs CUDA GPUs", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    res = run(ns)
    path = write_json(ns.output or default_output_path("allreduce"), res)
    print(_table(res))
    best = []
    for r in res["results"]:
        for s in r.get("sizes", []):
            if s["kb"] == 8 and "one_shot_graph_us" in s:
                best.append(f"TP{r['world_size']} 8 KB: NCCL {s['nccl_graph_us']:.1f} us, "
                            f"one-shot {s['one_shot_graph_us']:.1f} us")
    print_summary("; ".join(best) + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
