"""The file tier's read path on the CPU (issue 15): a restarted cache matching a prefix of
N tokens (Llama-3.1-8B-shaped KV, bf16: 128 KiB a token, 8 MiB a 64-token block) that only the
file tier holds. Times the match alone (it reads, checksums and copies the blocks itself) and,
where the code has a prefetcher, the prefetch and the match at once (a request admitted as it
arrives: the match waits for the prefetch threads) and the match after the request's prefetch
has run (a request that waited). Page cache hot.
From the repo root (any revision's python/ on PYTHONPATH):

    PYTHONPATH=python python benchmarks/results/issue15/l3/fetch_cpu.py --tokens 2048
"""
import argparse
import tempfile
import time

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

LAYERS, HEADS, DIM = 32, 8, 128


def cache(directory: str, slots: int) -> tuple[HiRadixCache, KVPool, KVAllocator]:
    pool = KVPool(slots, LAYERS, HEADS, DIM, torch.bfloat16, "cpu")
    alloc = KVAllocator(slots, 1, "cpu")
    c = HiRadixCache(ReqToTokenPool(2, slots, "cpu"), alloc, pool,
                     HiCacheConfig(ratio=0.01, storage_dir=directory, storage_namespace="bench"))
    return c, pool, alloc


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    ns = p.parse_args()
    torch.set_num_threads(1)
    directory = tempfile.mkdtemp()
    tokens = list(range(1000, 1000 + ns.tokens))
    first, pool, alloc = cache(directory, ns.tokens + 64)
    slots = alloc.alloc(ns.tokens)
    for b in pool.buffers():
        b.normal_()
    first.insert(tokens, slots)
    first.close()                                    # every block written
    for label in ("match reads", "prefetch, match at once", "after prefetch"):
        if label != "match reads" and not hasattr(HiRadixCache, "prefetch"):
            continue
        times = []
        for _ in range(ns.repeats):
            c, _, _ = cache(directory, ns.tokens + 64)
            start = time.perf_counter()
            if label != "match reads":
                c.prefetch(tokens + [1])
            if label == "after prefetch":
                (c.file_tier.prefetcher if hasattr(c, "file_tier") else c.prefetcher).wait_idle()
                start = time.perf_counter()
            m = c.match_prefix(tokens + [1])
            times.append(time.perf_counter() - start)
            assert len(m.indices) == ns.tokens
            c.close()
        print(f"{ns.tokens} tokens from the file tier, {label}: "
              f"{sorted(times)[len(times) // 2] * 1e3:.0f} ms (median of {ns.repeats})")


if __name__ == "__main__":
    main()
