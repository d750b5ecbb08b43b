"""The file tier's read path alone, on the device given (issue 15): a restarted cache matching a
prefix of N tokens (Llama-3.1-8B-shaped KV, bf16: 128 KiB a token, 8 MiB a 64-token block) that
only the file tier holds, timed to the end of the copy into device slots. Three ways: the match
reading the blocks itself, the prefetch and the match at once (a request admitted as it
arrives), and the match after the prefetch has run (a request that waited), plus the reads
alone (prefetch until idle). Page cache hot. From the repo root:

    PYTHONPATH=python python benchmarks/results/issue15/l3_staging/fetch_device.py --tokens 8192 --device cuda
"""
import argparse
import tempfile
import time

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

LAYERS, HEADS, DIM = 32, 8, 128


def cache(directory: str, slots: int, device: str):
    pool = KVPool(slots, LAYERS, HEADS, DIM, torch.bfloat16, device)
    alloc = KVAllocator(slots, 1, device)
    c = HiRadixCache(ReqToTokenPool(2, slots, device), alloc, pool,
                     HiCacheConfig(ratio=0.01, storage_dir=directory, storage_namespace="bench"))
    return c, pool, alloc


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    ns = p.parse_args()
    directory = tempfile.mkdtemp()
    tokens = list(range(1000, 1000 + ns.tokens))
    first, pool, alloc = cache(directory, ns.tokens + 64, ns.device)
    slots = alloc.alloc(ns.tokens)
    for b in pool.buffers():
        b.normal_()
    first.insert(tokens, slots)
    first.close()                                    # every block written
    del first, pool
    for label in ("reads alone", "match reads", "prefetch, match at once", "after prefetch"):
        times = []
        for _ in range(ns.repeats):
            c, _, _ = cache(directory, ns.tokens + 64, ns.device)
            sync(ns.device)
            start = time.perf_counter()
            if label != "match reads":
                c.prefetch(tokens + [1])
            if label in ("after prefetch", "reads alone"):
                c.file_tier.prefetcher.wait_idle()
                if label == "reads alone":
                    times.append(time.perf_counter() - start)
                    c.close()
                    continue
                start = time.perf_counter()
            m = c.match_prefix(tokens + [1])
            sync(ns.device)
            times.append(time.perf_counter() - start)
            assert len(m.indices) == ns.tokens // 64 * 64
            c.close()
        print(f"{ns.tokens} tokens from the file tier on {ns.device}, {label}: "
              f"{sorted(times)[len(times) // 2] * 1e3:.0f} ms (median of {ns.repeats}; "
              f"{', '.join(f'{t * 1e3:.0f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()
