"""Pieces `radixlm bench router` and its failover part share: starting engines and routers,
the shared-prefix workload, and sending it."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx

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


async def generate_one(session: aiohttp.ClientSession, url: str, prompt: str, params: dict,
                       stream: bool = False) -> dict:
    """One /generate request; its output (the last event of a stream, with its meta_info).
    Raises RuntimeError on an error answer, an error event in the stream, or a stream that
    ends before `data: [DONE]`."""
    payload: dict[str, Any] = {"text": prompt, "sampling_params": params}
    if stream:
        payload["stream"] = True
    async with session.post(url + "/generate", json=payload) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
        if r.content_type != "text/event-stream":
            return await r.json(content_type=None)
        last = None
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                if last is None:
                    raise RuntimeError("the stream ended without an output")
                return last
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error'].get('message')}"[:300])
            last = event
        raise RuntimeError("the stream ended before [DONE]")


def client_session(timeout_s: float = 3600) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


async def send_all(url: str, prompts: list[str], output_len: int,
                   max_concurrency: int | None) -> tuple[list[dict], float]:
    gate = asyncio.Semaphore(max_concurrency or len(prompts))
    params = sampling_params(output_len)
    async with client_session() as session:
        async def one(prompt: str) -> dict:
            async with gate:
                return await generate_one(session, url, prompt, params)

        start = time.perf_counter()
        outs = await asyncio.gather(*(one(p) for p in prompts))
        return list(outs), time.perf_counter() - start


def sampling_params(output_len: int) -> dict[str, Any]:
    return {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}


# ---------------------------------------------------------------------- engines

@contextlib.contextmanager
def engines_running(ns: argparse.Namespace) -> Iterator[list[tuple[subprocess.Popen, str]]]:
    """--num-engines `radixlm serve` children with --engine-args, each on its own GPU from 0 (or
    all on one with --share-gpu) and each in its own process group (session), so that stopping
    or killing one takes its scheduler and detokenizer with it. Yields [(process, url)] once
    all are healthy; stops them all on the way out."""
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
        yield engines
    finally:
        for proc, _ in engines:
            stop_server(proc)


def warm_up(workers: list[str], prompts: list[str]) -> None:
    """Kernels, graphs and allocator warmed on every engine, outside the timed runs; the
    prompts are prefixed so that they share no cached prefix with the workload's."""
    warm = [f"warm-up {i} " + p for i, p in enumerate(prompts[:8])]
    for u in workers:
        asyncio.run(send_all(u, warm, 8, None))


def engine_capacity(workers: list[str]) -> list[int]:
    return [httpx.get(u + "/get_server_info").json()["max_total_num_tokens"] for u in workers]


def workload_record(ns: argparse.Namespace, *extra: str) -> dict[str, Any]:
    return {k: getattr(ns, k) for k in (
        "num_groups", "prompts_per_group", "system_prompt_len", "question_len",
        "output_len", "max_concurrency", "seed", *extra)}


def list_workers(router_url: str) -> list[dict]:
    """The radixlm router's own view of its workers (url, healthy, in_flight, requests_total:
    attempts sent to each, failures_total), in --worker-urls order."""
    return httpx.get(router_url + "/list_workers", timeout=30).json()["workers"]
