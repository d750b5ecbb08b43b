"""`radixlm bench router`: the cache-aware router against round-robin and SGLang's router, and
what losing an engine mid-run costs.

--part cache (default): N radixlm engines (`radixlm serve` children with --engine-args, one per
  GPU, or all on one GPU with --share-gpu), and a shared-prefix workload (--num-groups groups,
  each a long system prompt shared by its --prompts-per-group questions, requests shuffled and
  sent at once). In one run, for each router (radixlm cache_aware, radixlm round_robin, and
  `sglang-router --policy cache_aware` when installed), on the same engines with flushed caches:
  output throughput, cache hit rate (sum of cached_tokens / sum of prompt_tokens in the
  responses), and how the requests were spread. The ceiling is the hit rate if every request
  went where its prefix is: each request hits its longest common token prefix with an earlier
  request of its group.
--part overhead: two trivial workers (bench/trivial_worker.py) that answer at once; sequential
  requests straight to a worker and through each router (the added median latency), then
  --concurrency clients for --duration seconds (requests/s through each router).
--part failover: the engines of --part cache behind one radixlm cache_aware router, and the same
  workload sent through it paced by --max-concurrency (default 16 per engine) or
  --request-rate; --kill-after seconds after the first request, one engine (--kill-engine, or
  the one with the most requests in flight) is SIGKILLed with its whole process group. Each
  request's send and end time and success or error are recorded (the router does not say
  which worker served a request; its /list_workers counts say how many went to each). Reported:
  requests failed, split into those sent before the kill (in flight then) and after it (not
  yet started: the target is 0); how long the router took to take the engine out and until
  the last failure (the time to recover); output throughput before and after the kill; the
  router's retries and per-worker failures from its /metrics.

    python -m radixlm.bench.router --engine-args "--model-path M --load-format dummy ..." \\
        --num-engines 2 --share-gpu
    python -m radixlm.bench.router --part overhead
    python -m radixlm.bench.router --part failover --engine-args "..." --num-engines 4 \\
        --max-concurrency 64 --kill-after 15
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import httpx

from radixlm.bench import common
from radixlm.bench.router_common import (build_workload, ceiling_hit_rate, engine_capacity,
                                        engines_running, list_workers, routers_to_compare, send_all,
                                        start_process, start_router, warm_up, workload_record)
from radixlm.bench.router_failover import failover_line, run_failover
from radixlm.utils.server_process import free_port, stop_server


def run_cache(ns: argparse.Namespace) -> dict[str, Any]:
    with engines_running(ns) as engines:
        workers = [url for _, url in engines]
        capacity = engine_capacity(workers)
        prompts = build_workload(ns)
        ids = httpx.post(workers[0] + "/tokenize", json={"prompt": prompts},
                         timeout=600).json()["tokens"]
        ceiling = ceiling_hit_rate(ids)
        warm_up(workers, prompts)
        runs = []
        for kind, policy in routers_to_compare(ns):
            for u in workers:
                httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
            proc, url = start_router(kind, policy, workers)
            try:
                outs, wall = asyncio.run(send_all(url, prompts, ns.output_len,
                                                  ns.max_concurrency))
                spread = ([w["requests_total"] for w in list_workers(url)]
                          if kind == "radixlm" else None)
            finally:
                stop_server(proc)
            prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
            cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
            output_tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            run = {"router": kind, "policy": policy, "wall_s": wall,
                   "output_tokens": output_tokens, "output_throughput": output_tokens / wall,
                   "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                   "cache_hit_rate": cached / prompt_tokens, "requests_per_engine": spread}
            runs.append(run)
            print(f"{kind} {policy}: {run['output_throughput']:.0f} output tok/s, hit rate "
                  f"{common.pct(run['cache_hit_rate'])} ({wall:.1f} s)", file=sys.stderr,
                  flush=True)
    by = {(r["router"], r["policy"]): r for r in runs}
    aware, rr = by[("radixlm", "cache_aware")], by[("radixlm", "round_robin")]
    sg = by.get(("sglang-router", "cache_aware"))
    return {
        "workload": workload_record(ns),
        "engines": {"count": ns.num_engines, "share_gpu": ns.share_gpu,
                    "engine_args": ns.engine_args, "kv_capacity_tokens": capacity},
        "ceiling_hit_rate": ceiling, "runs": runs,
        "throughput_vs_round_robin": aware["output_throughput"] / rr["output_throughput"],
        "throughput_vs_sglang_router": (aware["output_throughput"] / sg["output_throughput"]
                                        if sg else None),
        "hit_rate_vs_sglang_router": (aware["cache_hit_rate"] - sg["cache_hit_rate"]
                                      if sg else None),
    }


# ---------------------------------------------------------------------- router overhead

async def _sequential_ms(url: str, n: int) -> list[float]:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            t = time.perf_counter()
            async with s.post(url + "/generate", json=body) as r:
                await r.read()
            out.append(1e3 * (time.perf_counter() - t))
    return out


async def _requests_per_s(url: str, clients: int, duration: float) -> float:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    done = 0
    stop_at = time.perf_counter() + duration
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def client() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                async with s.post(url + "/generate", json=body) as r:
                    await r.read()
                done += 1
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - start)


def run_overhead(ns: argparse.Namespace) -> dict[str, Any]:
    workers = []
    try:
        for _ in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            workers.append((start_process([sys.executable, "-m", "radixlm.bench.trivial_worker",
                                           "--port", str(port)], url, 60), url))
        urls = [u for _, u in workers]
        targets: dict[str, str] = {"direct": urls[0]}
        routers = []
        for kind, policy in routers_to_compare(ns):
            if policy == "cache_aware":
                proc, url = start_router(kind, policy, urls)
                routers.append(proc)
                targets[kind] = url
        result: dict[str, Any] = {"requests": ns.num_requests, "concurrency": ns.concurrency,
                                  "duration_s": ns.duration}
        for name, url in targets.items():
            asyncio.run(_sequential_ms(url, 50))     # warm-up: connections, caches
            lat = asyncio.run(_sequential_ms(url, ns.num_requests))
            rps = asyncio.run(_requests_per_s(url, ns.concurrency, ns.duration))
            result[name] = {"median_ms": common.median(lat),
                            "p99_ms": sorted(lat)[int(0.99 * (len(lat) - 1))],
                            "requests_per_s": rps}
            print(f"{name}: median {result[name]['median_ms']:.2f} ms, {rps:.0f} req/s",
                  file=sys.stderr, flush=True)
        direct = result["direct"]["median_ms"]
        for name in targets:
            if name != "direct":
                result[name]["added_median_ms"] = result[name]["median_ms"] - direct
        if "sglang-router" in result:
            result["requests_per_s_vs_sglang_router"] = (
                result["radixlm"]["requests_per_s"] / result["sglang-router"]["requests_per_s"])
        for proc in routers:
            stop_server(proc)
        return result
    finally:
        for proc, _ in workers:
            stop_server(proc)


# ---------------------------------------------------------------------- driver

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("cache", "overhead", "failover"), default="cache")
    p.add_argument("--engine-args", default="", help="flags for each `radixlm serve` engine")
    p.add_argument("--num-engines", type=int, default=2)
    p.add_argument("--share-gpu", action="store_true",
                   help="all engines on one GPU (give each a small --mem-fraction-static)")
    p.add_argument("--num-groups", type=int, default=64)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int, default=2048, help="words (~tokens)")
    p.add_argument("--question-len", type=int, default=128, help="words (~tokens)")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="default: all at once (failover: 16 per engine unless --request-rate)")
    p.add_argument("--request-rate", type=float, default=None,
                   help="failover: requests per second, Poisson arrivals (default: all queued "
                        "at once, paced by --max-concurrency)")
    p.add_argument("--kill-after", type=float, default=3.0,
                   help="failover: seconds from the first request to the SIGKILL")
    p.add_argument("--kill-engine", type=int, default=None,
                   help="failover: the engine (0-based) to kill (default: the one with the "
                        "most requests in flight at the router then)")
    p.add_argument("--stream", action="store_true",
                   help="failover: streamed requests (one cut after its first chunk reaches "
                        "the client cannot be retried: it ends with an error event)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=1000, help="overhead: sequential")
    p.add_argument("--concurrency", type=int, default=64, help="overhead: clients")
    p.add_argument("--duration", type=float, default=5.0, help="overhead: seconds")
    p.add_argument("--output", default=None, help="JSON results (default: benchmarks/...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    common.require_positive(_parser(), ns, "num_engines", "num_groups", "prompts_per_group",
                            "system_prompt_len", "question_len", "output_len", "num_requests",
                            "concurrency")
    if ns.max_concurrency is not None and ns.max_concurrency < 1:
        _parser().error("--max-concurrency: must be >= 1")
    if ns.request_rate is not None and not ns.request_rate > 0:
        _parser().error("--request-rate: must be > 0")
    if ns.part == "failover":
        if ns.num_engines < 2:
            _parser().error("--part failover: --num-engines must be >= 2 (one is killed)")
        if not ns.kill_after > 0:
            _parser().error("--kill-after: must be > 0")
        if ns.kill_engine is not None and not 0 <= ns.kill_engine < ns.num_engines:
            _parser().error(f"--kill-engine: must be in 0..{ns.num_engines - 1}")
        if ns.max_concurrency is None and ns.request_rate is None:
            ns.max_concurrency = 16 * ns.num_engines
    run = {"cache": run_cache, "overhead": run_overhead, "failover": run_failover}[ns.part]
    result = run(ns)
    result["environment"] = common.environment(None)
    result["argv"] = list(argv) if argv is not None else sys.argv[1:]
    path = common.write_json(ns.output or common.default_output_path(f"router_{ns.part}"), result)
    if ns.part == "cache":
        line = (f"router cache: cache_aware vs round_robin "
                f"{result['throughput_vs_round_robin']:.2f}x output throughput; hit rate "
                + ", ".join(f"{r['router']} {r['policy']} {common.pct(r['cache_hit_rate'])}"
                            for r in result["runs"])
                + f" (ceiling {common.pct(result['ceiling_hit_rate'])})")
        if result["throughput_vs_sglang_router"] is not None:
            line += f"; vs sglang-router {result['throughput_vs_sglang_router']:.2f}x"
    elif ns.part == "failover":
        line = failover_line(result)
    else:
        line = "router overhead: " + ", ".join(
            f"{k} +{v['added_median_ms']:.2f} ms median, {v['requests_per_s']:.0f} req/s"
            for k, v in result.items() if isinstance(v, dict) and "added_median_ms" in v)
    common.print_summary(f"{line} -> {path}")
    return 1 if ns.part == "failover" and result["kill"] is None else 0


if __name__ == "__main__":
    raise SystemExit(main())
