"""`radixlm bench overlap`: decode throughput and GPU idle time with the overlap scheduler on vs
off, in one process and one run.

A Scheduler is driven directly (in-memory transport, no tokenizer or HTTP) over one ModelRunner:
`--batch-size` requests are prefilled, then `--steps` decode steps are timed, and a window of
`--profile-steps` steps runs under the torch profiler. GPU idle = 1 - (union of kernel intervals)
/ (first kernel start to last kernel end) over that window: the time the device waited for the
host. With the plain loop the host's per-step work (building the batch, reading results, stop
checks) sits between kernels; with overlap it runs while the next step computes.

The profiler itself slows the host: with CUPTI tracing the kernels of CUDA graphs, one
`graph.replay()` took 500-680 us of host time on an H200 against 13-28 us without it
(benchmarks/RESULTS.md), so under overlap the profiled window shows gaps the timed loop does
not have. `busy_over_unprofiled_step` compares the kernels' busy time a profiled step with the
wall time a step of the unprofiled loop: near 1 (or above: CUPTI also stretches short kernels
slightly), the device did not wait for the host in the timed loop; 1 minus it bounds the idle
time there from below when it is under 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Sequence

import torch

from radixlm.bench.common import (default_output_path, environment, print_summary, require_positive,
                                  sync_device, write_json)
from radixlm.config import ServerArgs
from radixlm.managers.messages import TokenizedGenerateReq
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.model_executor.model_runner import ModelRunner, create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig
from radixlm.scheduler.config import SchedulerConfig
from radixlm.sampling.params import SamplingParams
from radixlm.scheduler.scheduler import Scheduler
from radixlm.utils.gpu_activity import (busy_and_span, gaps_by_neighbours, kernel_intervals,
                                        named_device_events)


def gpu_busy_and_idle(prof) -> tuple[float, float] | None:
    """(busy microseconds, 1 - busy / span) over the CUDA kernels the profiler saw
    (overlapping kernels merged); None without any."""
    intervals = kernel_intervals(prof)
    if not intervals:
        return None
    busy, span = busy_and_span(intervals)
    return busy, (1.0 - busy / span if span > 0 else 0.0)


def measure(runner: ModelRunner, kv: KVCacheManager, args: ServerArgs,
            ns: argparse.Namespace) -> dict:
    kv.flush()
    outbox: list = []
    sched = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, lambda timeout: [],
                      outbox.append)
    vocab = runner.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    total_steps = ns.steps + ns.profile_steps + 4
    for i in range(ns.batch_size):
        ids = torch.randint(0, vocab, (ns.input_len,), generator=gen).tolist()
        params = SamplingParams(max_new_tokens=total_steps + 8, temperature=ns.temperature,
                                top_p=ns.top_p, top_k=ns.top_k, sampling_seed=i,
                                ignore_eos=True)
        sched.handle_message(TokenizedGenerateReq(rid=f"r{i}", input_ids=ids,
                                                  sampling_params=params))
    while sched.waiting or sched.chunked_req or len(sched.running) < ns.batch_size:
        sched.step()
    for _ in range(4):  # warm-up decode steps (and the pending prefill result)
        sched.step()
    dev = runner.device
    syncs = trace_host_syncs(lambda: [sched.step() for _ in range(3)]) if ns.check_syncs else None
    sync_device(dev)
    t = time.perf_counter()
    for _ in range(ns.steps):
        sched.step()
    sync_device(dev)
    seconds = time.perf_counter() - t
    idle, busy_ratio, kernels, gaps = None, None, None, None
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(ns.profile_steps):
                sched.step()
            sync_device(dev)
        busy_idle = gpu_busy_and_idle(prof)
        if busy_idle is not None:
            busy_us, idle = busy_idle
            busy_ratio = busy_us / ns.profile_steps / (seconds / ns.steps * 1e6)
        if ns.kernel_table:
            kernels = kernel_table(prof, ns.profile_steps, ns.kernel_table)
        if ns.gap_table:
            gaps = gap_table(prof, ns.profile_steps, ns.gap_table)
    while sched.has_work:
        sched.step()
    return {"decode_steps": ns.steps, "seconds": seconds,
            "step_ms": seconds / ns.steps * 1e3,
            "decode_tok_s": ns.batch_size * ns.steps / seconds,
            "gpu_idle_fraction": idle, "busy_over_unprofiled_step": busy_ratio,
            "overlapped_steps": sched.overlapped_steps,
            "kernels_per_step": kernels, "gaps_per_step": gaps,
            "host_syncs_in_3_steps": syncs}


def kernel_table(prof, steps: int, rows: int) -> list[dict]:
    """The `rows` kernels with the most device time, per step: name, launches, microseconds."""
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
              and e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events) / steps
    table = [{"name": e.key[:90], "per_step": e.count / steps,
              "us_per_step": e.device_time_total / steps} for e in events[:rows]]
    print(f"GPU time a step {total:.0f} us, {sum(e.count for e in events) / steps:.0f} kernels")
    for row in table:
        print(f"  {row['us_per_step']:8.1f} us  x{row['per_step']:5.1f}  {row['name']}")
    return [{"name": "all", "per_step": sum(e.count for e in events) / steps,
             "us_per_step": total}] + table


def gap_table(prof, steps: int, rows: int) -> list[dict]:
    """Where the device waited (utils/gpu_activity.gaps_by_neighbours), per step: the `rows`
    largest gaps over 3 us by the kernels or copies on either side. Gaps of a microsecond or
    two between the kernels of a CUDA graph are launch latency; long ones next to a copy or a
    kernel launched outside the graph are the host's."""
    totals, short = gaps_by_neighbours(named_device_events(prof))
    table = sorted(({"after": a[:60], "before": b[:60], "us_per_step": t / steps,
                     "per_step": n / steps} for (a, b), (t, n) in totals.items()),
                   key=lambda r: -r["us_per_step"])
    print(f"device gaps a step: {sum(r['us_per_step'] for r in table):.0f} us in gaps > 3 us, "
          f"{short / steps:.0f} us in shorter ones")
    for row in table[:rows]:
        print(f"  {row['us_per_step']:8.1f} us  x{row['per_step']:5.1f}  after {row['after']}"
              f"  before {row['before']}")
    return [{"name": "gaps of 3 us or less", "us_per_step": short / steps}] + table[:rows]


def trace_host_syncs(fn) -> list[str] | None:
    """Run fn with CUDA's sync debug mode on; return where each host synchronisation came from
    (the one intended wait per step, LaunchedStep.wait, shows up too)."""
    if not torch.cuda.is_available():
        return None
    import traceback
    import warnings
    seen: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        stack = [f for f in traceback.extract_stack()[:-1] if "radixlm" in f.filename]
        seen.append(str(message)[:80] + " @ " + " <- ".join(
            f"{f.filename.split('radixlm/')[-1]}:{f.lineno}" for f in reversed(stack[-4:])))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return seen


def decode_roofline(runner: ModelRunner, ns: argparse.Namespace) -> dict | None:
    """Bytes a decode step must read (`decode_step_bytes`: the weights, of a mixture of experts
    the experts the batch routes to, + the batch's KV at the mean context of the timed steps) /
    measured copy bandwidth, and the fraction of it each mode reached."""
    if runner.device.type != "cuda":
        return None
    from radixlm.bench.one_batch import copy_bandwidth, decode_step_bytes
    weight_bytes, kv_bytes = decode_step_bytes(runner, ns.batch_size,
                                               ns.input_len + 4 + ns.steps // 2)
    bw = copy_bandwidth(runner.device)
    return {"copy_bandwidth_gb_s": bw / 1e9, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
            "step_s": (weight_bytes + kv_bytes) / bw}


def run(ns: argparse.Namespace) -> dict:
    base = ServerArgs(model_path=ns.model_path, load_format=ns.load_format, dtype=ns.dtype,
                      tokenizer_path=ns.model_path, disable_cuda_graph=ns.disable_cuda_graph,
                      enable_torch_compile=ns.enable_torch_compile,
                      torch_compile_max_bs=ns.torch_compile_max_bs,
                      quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype,
                      max_running_requests=ns.batch_size,
                      max_total_tokens=ns.batch_size * (ns.input_len + ns.steps
                                                        + ns.profile_steps + 16) + 256)
    runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(base))
    results = {}
    for name, off in (("overlap_off", True), ("overlap_on", False)):
        results[name] = measure(runner, kv, dataclasses.replace(base, disable_overlap_schedule=off),
                                ns)
    results["speedup_on_over_off"] = (results["overlap_on"]["decode_tok_s"]
                                      / results["overlap_off"]["decode_tok_s"])
    results["roofline"] = roof = decode_roofline(runner, ns)
    if roof:
        for name in ("overlap_on", "overlap_off"):
            results[name]["fraction_of_roofline"] = roof["step_s"] / results[name]["seconds"] \
                * results[name]["decode_steps"]
    results["config"] = {k: v for k, v in vars(ns).items()}
    results["startup_phases"] = dict(runner.startup.seconds)     # torch_compile among them
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench overlap", description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--enable-torch-compile", action="store_true")
    p.add_argument("--torch-compile-max-bs", type=int, default=64)
    p.add_argument("--quantization", default=None, help="as the server's flag (fp8, w4a16, ...)")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="every request's sampling (default greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1, help="-1: off")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--kernel-table", type=int, default=0,
                   help="print the N kernels with the most GPU time per profiled step")
    p.add_argument("--gap-table", type=int, default=0,
                   help="print the N largest device gaps per profiled step, by the kernels or "
                        "copies on either side")
    p.add_argument("--check-syncs", action="store_true",
                   help="list the host synchronisations of 3 steps (CUDA sync debug mode)")
    p.add_argument("--output", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    require_positive(p, ns, "batch_size", "input_len", "steps")
    result = run(ns)
    result.update(environment(None), command="radixlm bench overlap " + " ".join(argv))
    path = write_json(ns.output or default_output_path("overlap"), result)
    on, off, roof = result["overlap_on"], result["overlap_off"], result["roofline"]
    idle = (f", GPU idle {off['gpu_idle_fraction']:.1%} -> {on['gpu_idle_fraction']:.1%} "
            f"(profiled; kernel busy / unprofiled step {off['busy_over_unprofiled_step']:.3f}"
            f" -> {on['busy_over_unprofiled_step']:.3f})"
            if on["gpu_idle_fraction"] is not None else "")
    print_summary(f"overlap bs {ns.batch_size}: decode {off['decode_tok_s']:.0f} -> "
                  f"{on['decode_tok_s']:.0f} tok/s ({result['speedup_on_over_off']:.2f}x)"
                  f"{idle}" + (f", {on['fraction_of_roofline']:.0%} of roofline" if roof else "")
                  + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
