"""`radixlm bench startup`: how long `radixlm serve` takes to become ready, and where the time
goes.

Starts `radixlm serve ARGS` `--runs` times in a row (the first run pays the one-off costs a
fresh machine has: Triton compiling its kernels into its cache; later runs find them cached),
timing each from the process launch to the first 200 from /health, then reads the scheduler's
per-phase seconds from /get_server_info (imports, device and ranks, weights, kv_cache,
cuda_graphs, tokenizer), and the serving process's own (resolving the model, starting the
processes, its tokenizer, waiting for the scheduler), and stops the server.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import httpx

from radixlm.bench.common import default_output_path, environment, print_summary, write_json
from radixlm.utils.server_process import launch_server, stop_server


def one_start(server_args: list[str], timeout_s: float) -> dict:
    t = time.perf_counter()
    proc, url = launch_server(server_args, timeout_s, poll_s=0.05)
    ready_s = time.perf_counter() - t
    try:
        info = httpx.get(url + "/get_server_info", timeout=30).json()
    finally:
        stop_server(proc, timeout_s=60)
    return {"ready_s": ready_s, "engine_s": info["startup_seconds"],
            "scheduler_phases_s": info["startup_phases"],
            "engine_phases_s": info.get("engine_startup_phases", {})}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixlm bench startup", description=__doc__)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--output", default=None)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="the rest of the command line goes to `radixlm serve`")
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = p.parse_args(argv)
    runs = []
    for i in range(ns.runs):
        r = one_start(ns.server_args, ns.timeout)
        runs.append(r)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["scheduler_phases_s"].items())
        engine = ", ".join(f"{k} {v:.2f}" for k, v in r["engine_phases_s"].items())
        print(f"run {i + 1}: ready in {r['ready_s']:.2f} s (engine {r['engine_s']:.2f} s: "
              f"{engine}; scheduler: {phases})", flush=True)
    result = {"runs": runs, **environment(None),
              "command": "radixlm bench startup " + " ".join(argv)}
    path = write_json(ns.output or default_output_path("startup"), result)
    times = ", ".join(f"{r['ready_s']:.1f}" for r in runs)
    print_summary(f"startup: ready in {times} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
