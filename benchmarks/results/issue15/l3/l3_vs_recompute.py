"""Issue 15's L3 target: a prefix of N tokens read from the file tier by a restarted server,
against recomputing it. Server 1 (file tier on) prefills prompt P (its blocks go to the
directory) and a second prompt Q; it stops (queued writes flushed). Server 2 on the same
directory answers P (a file-tier hit: the blocks are read, checksummed and copied in) and R (a
prompt nobody has seen: recomputed). Each request asks for 1 token, so its latency is its TTFT.
Page cache: the files were just written (hot), as on a restart soon after; with
--drop-page-cache the OS page cache is dropped first (needs root). From the repo root:

    PYTHONPATH=python python benchmarks/results/issue15/l3/l3_vs_recompute.py \\
        --server-args "$SA" --tokens 8000      # SA as in RESULTS.md (hicache sections)
"""
import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

from radixlm.bench.router_common import start_process
from radixlm.utils.server_process import free_port, stop_server


def ask(url: str, ids: list[int]) -> tuple[float, int]:
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}).encode()
    start = time.perf_counter()
    req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return time.perf_counter() - start, out["meta_info"]["cached_tokens"]


def serve(flags: list[str]):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                          "--log-level", "warning", *flags], url, 900)
    return proc, url


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--server-args", required=True)
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--drop-page-cache", action="store_true")
    p.add_argument("--warm-prefix-path", action="store_true",
                   help="warm the restarted server's extend-over-a-cached-prefix path too")
    p.add_argument("--output", default=None)
    ns = p.parse_args()
    rng = random.Random(0)
    prompts = {k: [rng.randrange(100, 40000) for _ in range(ns.tokens)] for k in "PQRW"}
    directory = tempfile.mkdtemp(prefix="l3-")
    flags = [*shlex.split(ns.server_args), "--max-total-tokens", str(4 * ns.tokens),
             "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
             "--hicache-storage-dir", directory]
    proc, url = serve(flags)
    try:
        ask(url, prompts["W"][:512])                  # warm-up
        first = {k: ask(url, prompts[k]) for k in "PQ"}
    finally:
        stop_server(proc)
    if ns.drop_page_cache:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    proc, url = serve(flags)
    try:
        ask(url, prompts["W"][-512:])                 # warm-up, another prefix
        if ns.warm_prefix_path:
            # Again: an extend over a cached prefix, the path the L3 hit takes (its kernels
            # compiled here, not in the timed hit; the recompute's path the line above warmed).
            ask(url, prompts["W"][-512:] + prompts["W"][:64])
        hit = ask(url, prompts["P"])
        recompute = ask(url, prompts["R"])
        with urllib.request.urlopen(url + "/get_server_info", timeout=60) as r:
            info = json.load(r)
    finally:
        stop_server(proc)
    result = {"tokens": ns.tokens, "first_server_s": {k: v[0] for k, v in first.items()},
              "l3_hit_s": hit[0], "l3_cached_tokens": hit[1], "recompute_s": recompute[0],
              "recompute_cached_tokens": recompute[1], "drop_page_cache": ns.drop_page_cache,
              "warm_prefix_path": ns.warm_prefix_path,
              "storage_hit_tokens": info.get("hicache_storage_hit_tokens"),
              "storage_prefetched_tokens": info.get("hicache_storage_prefetched_tokens"),
              "server_flags": flags}
    print(f"L3 {ns.tokens} tokens (page cache {'dropped' if ns.drop_page_cache else 'hot'}): "
          f"hit {hit[0] * 1e3:.0f} ms ({hit[1]} cached) vs recompute {recompute[0] * 1e3:.0f} "
          f"ms ({recompute[1]} cached); first server P/Q {first['P'][0] * 1e3:.0f} / "
          f"{first['Q'][0] * 1e3:.0f} ms; prefetched {result['storage_prefetched_tokens']}",
          flush=True)
    if ns.output:
        with open(ns.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
