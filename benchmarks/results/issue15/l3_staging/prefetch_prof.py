"""Where the prefetcher's 350 ms for 1 GiB go: per-call timers around get_into / pieces / acquire, and the wall."""
import sys, tempfile, threading, time
import torch
sys.path.insert(0, "python")
from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

def cache(d, slots):
    pool = KVPool(slots, 32, 8, 128, torch.bfloat16, "cuda")
    alloc = KVAllocator(slots, 1, "cuda")
    c = HiRadixCache(ReqToTokenPool(2, slots, "cuda"), alloc, pool,
                     HiCacheConfig(ratio=0.01, storage_dir=d, storage_namespace="b"))
    return c, pool, alloc
tokens = list(range(1000, 1000 + 8192))
d = tempfile.mkdtemp()
first, pool, alloc = cache(d, 8256)
s = alloc.alloc(8192)
for b in pool.buffers():
    b.normal_()
first.insert(tokens, s)
first.close()
del first, pool
acc, lock = {}, threading.Lock()
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); dt = time.perf_counter() - t
        with lock:
            acc[name] = acc.get(name, 0.0) + dt
        return r
    return w
for rep in range(3):
    c, _, _ = cache(d, 8256)
    tier = c.file_tier
    acc.clear()
    tier.storage.get_into = timed("get_into", tier.storage.get_into)
    tier.arena.pieces = timed("pieces", tier.arena.pieces)
    tier.arena.acquire = timed("acquire", tier.arena.acquire)
    tier.arena.available = timed("available", tier.arena.available)
    t = time.perf_counter()
    c.prefetch(tokens + [1])
    t1 = time.perf_counter()
    tier.prefetcher.wait_idle()
    wall = time.perf_counter() - t
    print(f"rep {rep}: wall {wall*1e3:.0f} ms (prefetch call {(t1-t)*1e3:.1f} ms); summed over threads: " + ", ".join(f"{k} {v*1e3:.0f} ms" for k, v in acc.items()), flush=True)
    c.close()
# the same files read by 8 plain threads into the arena's pieces, no prefetcher
from concurrent.futures import ThreadPoolExecutor
c, _, _ = cache(d, 8256)
tier = c.file_tier
names = tier.names(tokens)
allp = [tier.arena.pieces(b) for b in range(128)]
ex = ThreadPoolExecutor(8)
for rep in range(3):
    t = time.perf_counter()
    ok = list(ex.map(lambda i: tier.storage.get_into(names[i], allp[i]), range(128)))
    print(f"plain pool, pieces precomputed: {(time.perf_counter()-t)*1e3:.0f} ms, all ok {all(ok)}", flush=True)
