"""Diagnostic for issue 15: the `bench hicache` multi-turn workload under the server's GPU
profiler (HiCache on with a 32k-token device cache, then a server whose cache fits everything),
printing wall time, GPU busy time and kernel time by name. From the repo root:

    PYTHONPATH=python python benchmarks/results/issue15/kernel_copies/profile_multi_turn.py \
        --server-args "$SA"        # SA as in RESULTS.md
"""

import argparse
import asyncio
import gzip
import json
import shlex
import sys
import tempfile
from collections import defaultdict

import httpx

from radixlm.bench import hicache
from radixlm.bench.router_common import start_process
from radixlm.utils.server_process import free_port, stop_server


def run(label: str, extra: list[str], ns: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                          "--log-level", "warning", *shlex.split(ns.server_args), *extra],
                         url, 900)
    try:
        warm = argparse.Namespace(**{**vars(ns), "num_users": 2, "num_turns": 1, "seed": 999})
        asyncio.run(hicache.run_users(url, warm))
        httpx.post(url + "/start_profile", json={"output_dir": tempfile.mkdtemp(),
                                                 "activities": ["GPU"]},
                   timeout=60).raise_for_status()
        _, wall = asyncio.run(hicache.run_users(url, ns))
        res = httpx.post(url + "/stop_profile", timeout=600).json()
        info = httpx.get(url + "/get_server_info", timeout=60).json()
    finally:
        stop_server(proc)
    seconds, count = defaultdict(float), defaultdict(int)
    for e in json.load(gzip.open(res["trace_path"])).get("traceEvents", []):
        if e.get("cat") == "kernel":
            seconds[e["name"][:70]] += e.get("dur", 0) / 1e6
            count[e["name"][:70]] += 1
    print(f"== {label}: wall {wall:.2f} s, gpu busy {res.get('gpu_busy_s')}, span "
          f"{res.get('gpu_span_s')}, kernels {res.get('num_kernels')}, loaded "
          f"{info.get('hicache_loaded_tokens')}, backed up {info.get('hicache_backed_up_tokens')}")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {s:8.3f} s  {count[name]:7d}  {name}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--server-args", required=True)
    for flag, default in [("num_users", 32), ("num_turns", 6), ("system_prompt_len", 2048),
                          ("question_len", 64), ("output_len", 32), ("seed", 0)]:
        p.add_argument("--" + flag.replace("_", "-"), type=int, default=default)
    ns = p.parse_args()
    run("hicache on, device 32k", ["--max-total-tokens", "32768",
                                   "--enable-hierarchical-cache", "--hicache-ratio", "4"], ns)
    run("fits (device 300k, no hicache)", ["--max-total-tokens", "300000"], ns)


if __name__ == "__main__":
    main()
