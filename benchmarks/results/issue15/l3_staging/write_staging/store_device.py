"""The file tier's write path alone, on the device given (issue 15): a cache inserting a freshly
computed prefix of N tokens (Llama-3.1-8B-shaped KV, bf16: 128 KiB a token, 8 MiB a 64-token
block), timed on the scheduler's thread (the insert call, which queues the writes) and to the
end of the writes (the writer flushed). Each repeat writes into a fresh directory. Run with the
code to measure first on PYTHONPATH. From the repo root:

    PYTHONPATH=python python benchmarks/results/issue15/l3_staging/write_staging/store_device.py \
        --tokens 8192 --device cuda
"""
import argparse
import json
import tempfile
import time

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

LAYERS, HEADS, DIM = 32, 8, 128


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--label", default="")
    p.add_argument("--output", default=None)
    ns = p.parse_args()
    slots_n = ns.tokens + 64
    pool = KVPool(slots_n, LAYERS, HEADS, DIM, torch.bfloat16, ns.device)
    for b in pool.buffers():
        b.normal_()
    tokens = list(range(1000, 1000 + ns.tokens))
    insert_s, written_s = [], []
    for _ in range(ns.repeats):
        alloc = KVAllocator(slots_n, 1, ns.device)
        c = HiRadixCache(ReqToTokenPool(2, slots_n, ns.device), alloc, pool,
                         HiCacheConfig(ratio=0.01, storage_dir=tempfile.mkdtemp(),
                                       storage_namespace="bench"))
        slots = alloc.alloc(ns.tokens)
        if ns.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        c.insert(tokens, slots)
        insert_s.append(time.perf_counter() - start)
        c.file_tier.writer.flush()
        written_s.append(time.perf_counter() - start)
        stored = len(c.file_tier._stored)
        c.close()
        assert stored == ns.tokens // 64, stored
    med = lambda xs: sorted(xs)[len(xs) // 2]   # noqa: E731
    result = {"label": ns.label, "tokens": ns.tokens, "device": ns.device,
              "insert_ms": [t * 1e3 for t in insert_s], "written_ms": [t * 1e3 for t in written_s]}
    print(f"{ns.label} {ns.tokens} tokens to the file tier on {ns.device}: insert (scheduler's "
          f"thread) {med(insert_s) * 1e3:.1f} ms, all written {med(written_s) * 1e3:.0f} ms "
          f"(median of {ns.repeats})", flush=True)
    if ns.output:
        with open(ns.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
