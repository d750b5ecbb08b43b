"""`radixlm bench hicache`: the hierarchical cache on vs off, and its copy bandwidth.

Workloads (`--part`), each run against a fresh `radixlm serve` (--server-args) with HiCache off
and then on (--enable-hierarchical-cache --hicache-ratio R), in the same run: throughput,
median / p90 time to first token (streamed), and the cache hit rate (cached_tokens /
prompt_tokens in the responses). The device KV cache is kept small (--max-total-tokens, passed
to the server) so that the working set does not fit on it while it fits the host pool.

- multi-turn: --num-users users talk at once, each with its own --system-prompt-len-word system
  prompt; each sends --num-turns turns one after the other, every turn re-sending the whole
  history (system prompt, earlier questions and answers) plus a new question.
- long-doc: --num-docs documents of --doc-len words; --num-users clients ask --questions-per-doc
  questions about each, the documents taken in turn (doc 0, 1, ..., D-1, 0, 1, ...), so a
  document's next question comes after all the others' (the order that defeats an LRU cache
  smaller than the documents).
- bandwidth (in this process, CUDA only): host -> device loads and device -> host backups of
  --bandwidth-tokens scattered slots by the hierarchical cache's copy kernel, in a pool shaped
  like the server's model (--bandwidth-model-path), against one contiguous pinned copy of the
  same bytes (cudaMemcpyAsync: what PCIe gives).

    python -m radixlm.bench.hicache --server-args "--model-path M --load-format dummy" \\
        --max-total-tokens 16384 --num-users 32 --num-turns 6 --part multi-turn,bandwidth
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
import urllib.request
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


async def run_documents(url: str, ns: argparse.Namespace) -> tuple[list[dict], float]:
    rng = random.Random(ns.seed)
    docs = [f"[Document {d}] " + _words(rng, ns.doc_len) for d in range(ns.num_docs)]
    queue = [(d, q) for q in range(ns.questions_per_doc) for d in range(ns.num_docs)]
    questions = {key: _words(rng, ns.question_len) for key in queue}
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        pending = iter(queue)

        async def client() -> list[dict]:
            answers = []
            for d, q in pending:     # shared: each client takes the next question
                prompt = f"{docs[d]}\nQuestion: {questions[d, q]}\nAnswer:"
                answers.append({**await _turn(session, url, prompt, ns.output_len), "doc": d})
            return answers

        start = time.perf_counter()
        results = await asyncio.gather(*(client() for _ in range(ns.num_users)))
        return [a for answers in results for a in answers], time.perf_counter() - start


WORKLOADS = {"multi-turn": run_users, "long-doc": run_documents}


def run_setting(ns: argparse.Namespace, hicache: bool, workload: str) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = shlex.split(ns.server_args) + ["--max-total-tokens", str(ns.max_total_tokens)]
    if hicache:
        flags += ["--enable-hierarchical-cache", "--hicache-ratio", str(ns.hicache_ratio)]
    proc = start_process([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                          "--log-level", "warning", *flags], url, 900)
    try:
        # Warm-up (compiles, first allocations) on other prompts, then the timed workload.
        asyncio.run(run_users(url, argparse.Namespace(**{**vars(ns), "num_users": 2,
                                                         "num_turns": 1, "seed": 999})))
        turns, wall = asyncio.run(WORKLOADS[workload](url, ns))
        with urllib.request.urlopen(url + "/get_server_info", timeout=60) as r:
            info = json.load(r)
    finally:
        stop_server(proc)
    ttfts = sorted(t["ttft"] for t in turns)
    prompt = sum(t["prompt_tokens"] for t in turns)
    out_tokens = sum(t["completion_tokens"] for t in turns)
    return {"hicache": hicache, "workload": workload, "wall_s": wall, "requests": len(turns),
            "output_throughput": out_tokens / wall,
            "total_throughput": (prompt + out_tokens) / wall,
            "ttft_median_s": common.median(ttfts),
            "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
            "prompt_tokens": prompt, "cached_tokens": sum(t["cached_tokens"] for t in turns),
            "cache_hit_rate": sum(t["cached_tokens"] for t in turns) / prompt,
            # since the server started (the warm-up included)
            **{k: info[k] for k in ("hicache_loaded_tokens", "hicache_backed_up_tokens")},
            "server_flags": flags}


def compare(ns: argparse.Namespace, workload: str) -> dict[str, Any]:
    off, on = run_setting(ns, False, workload), run_setting(ns, True, workload)
    result = {"off": off, "on": on,
              "throughput_ratio": on["total_throughput"] / off["total_throughput"],
              "ttft_median_reduction": 1 - on["ttft_median_s"] / off["ttft_median_s"]}
    common.print_summary(
        f"hicache {workload}: throughput {result['throughput_ratio']:.2f}x "
        f"({off['wall_s']:.1f} -> {on['wall_s']:.1f} s), median TTFT "
        f"{off['ttft_median_s'] * 1e3:.0f} -> {on['ttft_median_s'] * 1e3:.0f} ms "
        f"({common.pct(result['ttft_median_reduction'])} lower), p90 "
        f"{off['ttft_p90_s'] * 1e3:.0f} -> {on['ttft_p90_s'] * 1e3:.0f} ms, hit rate "
        f"{common.pct(off['cache_hit_rate'])} -> {common.pct(on['cache_hit_rate'])}; "
        f"tokens loaded {on['hicache_loaded_tokens']}, backed up "
        f"{on['hicache_backed_up_tokens']}")
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixlm bench hicache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", default="multi-turn",
                   help=f"comma-separated: {', '.join([*WORKLOADS, 'bandwidth'])}")
    p.add_argument("--server-args", default="", help="flags for both `radixlm serve` runs")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="device KV capacity")
    p.add_argument("--hicache-ratio", type=float, default=8.0)
    p.add_argument("--num-users", type=int, default=32, help="concurrent users / clients")
    p.add_argument("--num-turns", type=int, default=6)
    p.add_argument("--system-prompt-len", type=int, default=1024, help="words (~tokens)")
    p.add_argument("--question-len", type=int, default=64, help="words (~tokens)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-docs", type=int, default=16)
    p.add_argument("--doc-len", type=int, default=4096, help="words (~tokens)")
    p.add_argument("--questions-per-doc", type=int, default=4)
    p.add_argument("--bandwidth-model-path", default=None,
                   help="model whose KV layout the bandwidth part uses (default: --model-path "
                        "of --server-args)")
    p.add_argument("--bandwidth-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    return p


def _model_path(server_args: str) -> str | None:
    flags = shlex.split(server_args)
    return next((flags[i + 1] for i, f in enumerate(flags[:-1]) if f == "--model-path"), None)


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    common.require_positive(_parser(), ns, "max_total_tokens", "num_users", "num_turns",
                            "system_prompt_len", "question_len", "output_len", "num_docs",
                            "doc_len", "questions_per_doc", "bandwidth_tokens")
    parts = [p.strip() for p in ns.part.split(",") if p.strip()]
    unknown = [p for p in parts if p not in (*WORKLOADS, "bandwidth")]
    if unknown or not parts:
        _parser().error(f"--part: unknown {unknown or ns.part!r}; "
                        f"choose from {', '.join([*WORKLOADS, 'bandwidth'])}")
    result: dict[str, Any] = {}
    for part in parts:
        if part == "bandwidth":
            from radixlm.bench.hicache_bandwidth import measure
            model = ns.bandwidth_model_path or _model_path(ns.server_args)
            if model is None:
                _parser().error("--part bandwidth: give --bandwidth-model-path or a "
                                "--model-path in --server-args")
            result["bandwidth"] = measure(model, ns.bandwidth_tokens, ns.seed)
        else:
            result[part] = compare(ns, part)
    result.update({
        "workload": {k: getattr(ns, k) for k in (
            "num_users", "num_turns", "system_prompt_len", "question_len", "output_len",
            "num_docs", "doc_len", "questions_per_doc", "max_total_tokens", "hicache_ratio",
            "seed")},
        "environment": common.environment(None),
        "argv": list(argv) if argv is not None else sys.argv[1:]})
    path = common.write_json(ns.output or common.default_output_path("hicache"), result)
    common.print_summary(f"hicache -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
