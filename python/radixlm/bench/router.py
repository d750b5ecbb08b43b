"""`radixlm bench router`: the cache-aware router against round-robin and SGLang's router.

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

    python -m radixlm.bench.router --engine-args "--model-path M --load-format dummy ..." \\
        --num-engines 2 --share-gpu
    python -m radixlm.bench.router --part overhead
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import random
import shlex
import subprocess
import sys
import time
from typing import Any, Sequence

import aiohttp
import httpx

from radixlm.bench import common
from radixlm.utils.sequences import common_prefix_len
from radixlm.utils.server_process import free_port, stop_server, wait_healthy

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city community "
         "name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason "
         "research girl guy moment air teacher force education").split()


# ---------------------------------------------------------------------- processes

def start_process(cmd: list[str], url: str, timeout_s: float) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, start_new_session=True)
    wait_healthy(proc, url, timeout_s, poll_s=0.3)
    return proc


def start_router(kind: str, policy: str, workers: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "radixlm":
        cmd = [sys.executable, "-m", "radixlm.cli", "router", "--log-level", "warning",
               "--policy", policy]
    else:
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--log-level", "warn",
               "--policy", policy, "--prometheus-port", str(free_port())]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    url = f"http://127.0.0.1:{port}"
    return start_process(cmd, url, 120), url


def routers_to_compare(ns: argparse.Namespace) -> list[tuple[str, str]]:
    out = [("radixlm", "cache_aware"), ("radixlm", "round_robin")]
    try:
        import sglang_router  # noqa: F401
        out.append(("sglang-router", "cache_aware"))
    except ImportError:
        print("sglang-router is not installed: compared with round-robin only", file=sys.stderr)
    return out


# ---------------------------------------------------------------------- the cache workload

def build_workload(ns: argparse.Namespace) -> list[str]:
    """The prompts, group by group, then shuffled."""
    rng = random.Random(ns.seed)
    prompts = []
    for g in range(ns.num_groups):
        system = f"[Group {g}] " + " ".join(rng.choice(WORDS) for _ in range(ns.system_prompt_len))
        for q in range(ns.prompts_per_group):
            question = " ".join(rng.choice(WORDS) for _ in range(ns.question_len))
            prompts.append(f"{system}\nQuestion {q}: {question}\nAnswer:")
    rng.shuffle(prompts)
    return prompts


def ceiling_hit_rate(token_ids: list[list[int]]) -> float:
    """Cached tokens if each request found the longest prefix it shares with any earlier
    request (arrival order; one engine with an unbounded cache), over all prompt tokens. The
    longest common prefix with a set of sequences is with a neighbour in sorted order."""
    earlier: list[tuple[int, ...]] = []
    hits = 0
    for ids in map(tuple, token_ids):
        i = bisect.bisect_left(earlier, ids)
        neighbours = [earlier[j] for j in (i - 1, i) if 0 <= j < len(earlier)]
        best = max((common_prefix_len(ids, e) for e in neighbours), default=0)
        hits += min(best, len(ids) - 1)    # at least one token is always computed
        earlier.insert(i, ids)
    return hits / sum(len(t) for t in token_ids)


async def send_all(url: str, prompts: list[str], output_len: int,
                   max_concurrency: int | None) -> tuple[list[dict], float]:
    gate = asyncio.Semaphore(max_concurrency or len(prompts))
    params = {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as session:
        async def one(prompt: str) -> dict:
            async with gate:
                async with session.post(url + "/generate", json={
                        "text": prompt, "sampling_params": params}) as r:
                    body = await r.json(content_type=None)
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {body}")
                    return body

        start = time.perf_counter()
        outs = await asyncio.gather(*(one(p) for p in prompts))
        return list(outs), time.perf_counter() - start


def run_cache(ns: argparse.Namespace) -> dict[str, Any]:
    engines: list[tuple[subprocess.Popen, str]] = []
    try:
        for i in range(ns.num_engines):
            port = free_port()
            gpu = [] if ns.share_gpu else ["--base-gpu-id", str(i)]
            cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                   "--log-level", "warning", *gpu, *shlex.split(ns.engine_args)]
            engines.append((subprocess.Popen(cmd, start_new_session=True),
                            f"http://127.0.0.1:{port}"))
        for proc, url in engines:
            wait_healthy(proc, url, 900)
        workers = [url for _, url in engines]
        capacity = [httpx.get(u + "/get_server_info").json()["max_total_num_tokens"]
                    for u in workers]
        prompts = build_workload(ns)
        ids = httpx.post(workers[0] + "/tokenize", json={"prompt": prompts},
                         timeout=600).json()["tokens"]
        ceiling = ceiling_hit_rate(ids)
        # Warm-up (kernels, graphs, allocator) on every engine, outside the timed runs.
        for u in workers:
            asyncio.run(send_all(u, [f"warm-up {i} " + prompts[i] for i in range(8)], 8, None))
        runs = []
        for kind, policy in routers_to_compare(ns):
            for u in workers:
                httpx.post(u + "/flush_cache", timeout=60).raise_for_status()
            proc, url = start_router(kind, policy, workers)
            try:
                outs, wall = asyncio.run(send_all(url, prompts, ns.output_len,
                                                  ns.max_concurrency))
                spread = ([w["requests_total"] for w in httpx.get(
                    url + "/list_workers").json()["workers"]] if kind == "radixlm" else None)
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
            "workload": {k: getattr(ns, k) for k in (
                "num_groups", "prompts_per_group", "system_prompt_len", "question_len",
                "output_len", "max_concurrency", "seed")},
            "engines": {"count": ns.num_engines, "share_gpu": ns.share_gpu,
                        "engine_args": ns.engine_args, "kv_capacity_tokens": capacity},
            "ceiling_hit_rate": ceiling, "runs": runs,
            "throughput_vs_round_robin": aware["output_throughput"] / rr["output_throughput"],
            "throughput_vs_sglang_router": (aware["output_throughput"] / sg["output_throughput"]
                                            if sg else None),
            "hit_rate_vs_sglang_router": (aware["cache_hit_rate"] - sg["cache_hit_rate"]
                                          if sg else None),
        }
    finally:
        for proc, _ in engines:
            stop_server(proc)


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
    p.add_argument("--part", choices=("cache", "overhead"), default="cache")
    p.add_argument("--engine-args", default="", help="flags for each `radixlm serve` engine")
    p.add_argument("--num-engines", type=int, default=2)
    p.add_argument("--share-gpu", action="store_true",
                   help="all engines on one GPU (give each a small --mem-fraction-static)")
    p.add_argument("--num-groups", type=int, default=64)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int, default=2048, help="words (~tokens)")
    p.add_argument("--question-len", type=int, default=128, help="words (~tokens)")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-concurrency", type=int, default=None, help="default: all at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=1000, help="overhead: sequential")
    p.add_argument("--concurrency", type=int, default=64, help="overhead: clients")
    p.add_argument("--duration", type=float, default=5.0, help="overhead: seconds")
    p.add_argument("--output", default=None, help="JSON results (default: benchmarks/...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    for flag in ("num_engines", "num_groups", "prompts_per_group", "system_prompt_len",
                 "question_len", "output_len", "num_requests", "concurrency"):
        if getattr(ns, flag) < 1:
            _parser().error(f"--{flag.replace('_', '-')}: must be >= 1")
    result = run_cache(ns) if ns.part == "cache" else run_overhead(ns)
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
    else:
        line = "router overhead: " + ", ".join(
            f"{k} +{v['added_median_ms']:.2f} ms median, {v['requests_per_s']:.0f} req/s"
            for k, v in result.items() if isinstance(v, dict) and "added_median_ms" in v)
    common.print_summary(f"{line} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
