"""`radixlm bench hicache`: the hierarchical cache on vs off, on a multi-turn chat workload.

--num-users users talk at once, each with its own --system-prompt-len-word system prompt; each
user sends --num-turns turns one after the other, and every turn re-sends the whole history
(system prompt, earlier questions and answers) plus a new question. The device KV cache is kept
small (--max-total-tokens, passed to the server) so that all users' histories do not fit on it,
while they do fit the host pool. For each setting, in the same run, a fresh `radixlm serve`
(--server-args, plus --enable-hierarchical-cache --hicache-ratio R for "on"): throughput,
median / p90 time to first token (streamed), and the cache hit rate (cached_tokens /
prompt_tokens in the responses).

    python -m radixlm.bench.hicache --server-args "--model-path M --load-format dummy" \\
        --max-total-tokens 16384 --num-users 32 --num-turns 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from typing import Any, Sequence

import aiohttp

from radixlm.bench import common
from radixlm.bench.router_common import WORDS, start_process
from radixlm.utils.server_process import free_port, stop_server


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _turn(session: aiohttp.ClientSession, url: str, prompt: str,
                output_len: int) -> dict[str, Any]:
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True,
                                "temperature": 0}}
    start = time.perf_counter()
    ttft, last = None, None
    async with session.post(url + "/generate", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            last = json.loads(line[6:])
    assert last is not None and ttft is not None
    return {"ttft": ttft, "text": last["text"], **{k: last["meta_info"][k] for k in (
        "prompt_tokens", "cached_tokens", "completion_tokens")}}


async def run_users(url: str, ns: argparse.Namespace) -> tuple[list[dict], float]:
    rng = random.Random(ns.seed)
    systems = [f"[User {u}] " + _words(rng, ns.system_prompt_len) for u in range(ns.num_users)]
    questions = [[_words(rng, ns.question_len) for _ in range(ns.num_turns)]
                 for _ in range(ns.num_users)]
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async def user(u: int) -> list[dict]:
            history, turns = systems[u], []
            for t in range(ns.num_turns):
                prompt = f"{history}\nUser: {questions[u][t]}\nAssistant:"
                out = await _turn(session, url, prompt, ns.output_len)
                turns.append({**out, "turn": t})
                history = prompt + out["text"]
            return turns

        start = time.perf_counter()
        results = await asyncio.gather(*(user(u) for u in range(ns.num_users)))
        return [t for turns in results for t in turns], time.perf_counter() - start


def run_setting(ns: argparse.Namespace, hicache: bool) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = shlex.split(ns.server_args) + ["--max-total-tokens", str(ns.max_total_tokens)]
    if hicache:
        flags += ["--enable-hierarchical-cache", "--hicache-ratio", str(ns.hicache_ratio)]
    proc = start_process([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                          "--log-level", "warning", *flags], url, 900)
    try:
        asyncio.run(run_users(url, argparse.Namespace(**{**vars(ns), "num_users": 2,
                                                         "num_turns": 1, "seed": 999})))
        turns, wall = asyncio.run(run_users(url, ns))
    finally:
        stop_server(proc)
    ttfts = sorted(t["ttft"] for t in turns)
    prompt = sum(t["prompt_tokens"] for t in turns)
    out_tokens = sum(t["completion_tokens"] for t in turns)
    return {"hicache": hicache, "wall_s": wall, "requests": len(turns),
            "output_throughput": out_tokens / wall,
            "total_throughput": (prompt + out_tokens) / wall,
            "ttft_median_s": common.median(ttfts),
            "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
            "prompt_tokens": prompt, "cached_tokens": sum(t["cached_tokens"] for t in turns),
            "cache_hit_rate": sum(t["cached_tokens"] for t in turns) / prompt,
            "server_flags": flags}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench hicache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="", help="flags for both `radixlm serve` runs")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="device KV capacity")
    p.add_argument("--hicache-ratio", type=float, default=8.0)
    p.add_argument("--num-users", type=int, default=32)
    p.add_argument("--num-turns", type=int, default=6)
    p.add_argument("--system-prompt-len", type=int, default=1024, help="words (~tokens)")
    p.add_argument("--question-len", type=int, default=64, help="words (~tokens)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    for flag in ("max_total_tokens", "num_users", "num_turns", "system_prompt_len",
                 "question_len", "output_len"):
        if getattr(ns, flag) < 1:
            _parser().error(f"--{flag.replace('_', '-')}: must be >= 1")
    off, on = run_setting(ns, hicache=False), run_setting(ns, hicache=True)
    result = {"off": off, "on": on,
              "throughput_ratio": on["total_throughput"] / off["total_throughput"],
              "ttft_median_reduction": 1 - on["ttft_median_s"] / off["ttft_median_s"],
              "workload": {k: getattr(ns, k) for k in (
                  "num_users", "num_turns", "system_prompt_len", "question_len", "output_len",
                  "max_total_tokens", "hicache_ratio", "seed")},
              "environment": common.environment(None),
              "argv": list(argv) if argv is not None else sys.argv[1:]}
    path = common.write_json(ns.output or common.default_output_path("hicache"), result)
    common.print_summary(
        f"hicache: throughput {result['throughput_ratio']:.2f}x, median TTFT "
        f"{off['ttft_median_s'] * 1e3:.0f} -> {on['ttft_median_s'] * 1e3:.0f} ms "
        f"({common.pct(result['ttft_median_reduction'])} lower), p90 "
        f"{off['ttft_p90_s'] * 1e3:.0f} -> {on['ttft_p90_s'] * 1e3:.0f} ms, hit rate "
        f"{common.pct(off['cache_hit_rate'])} -> {common.pct(on['cache_hit_rate'])} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
