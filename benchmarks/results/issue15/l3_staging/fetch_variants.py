"""Reads alone (prefetch of 8k tokens, 8B-shaped bf16 KV) with 8 / 16 threads and sha256 / crc32 / no checksum."""
import hashlib, sys, tempfile, time, zlib
import torch
sys.path.insert(0, "python")
from radixlm.mem_cache import kv_storage, file_tier
from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

class Crc:
    def __init__(self, data=b""):
        self.c = zlib.crc32(data)
    def update(self, d):
        self.c = zlib.crc32(d, self.c)
    def digest(self):
        return self.c.to_bytes(4, "little") * 8

class NoSum:
    def __init__(self, data=b""): pass
    def update(self, d): pass
    def digest(self): return b"\0" * 32

class H:   # a hashlib stand-in for kv_storage
    sha256 = None

def cache(d, slots, threads):
    pool = KVPool(slots, 32, 8, 128, torch.bfloat16, "cuda")
    alloc = KVAllocator(slots, 1, "cuda")
    c = HiRadixCache(ReqToTokenPool(2, slots, "cuda"), alloc, pool,
                     HiCacheConfig(ratio=0.01, storage_dir=d, storage_namespace="b"))
    c.file_tier.prefetcher._threads._max_workers = threads
    return c, pool, alloc

tokens = list(range(1000, 1000 + 8192))
for name, impl in (("sha256", hashlib.sha256), ("crc32", Crc), ("none", NoSum)):
    H.sha256 = impl
    kv_storage.hashlib = H
    d = tempfile.mkdtemp()
    first, pool, alloc = cache(d, 8256, 8)
    s = alloc.alloc(8192)
    for b in pool.buffers():
        b.normal_()
    first.insert(tokens, s)
    first.close()
    del first, pool
    for threads in (8, 16):
        times = []
        for _ in range(3):
            c, _, _ = cache(d, 8256, threads)
            t = time.perf_counter()
            c.prefetch(tokens + [1])
            c.file_tier.prefetcher.wait_idle()
            times.append(time.perf_counter() - t)
            assert c.file_tier.prefetcher.held == 128, c.file_tier.prefetcher.held
            c.close()
        print(f"{name:7s} threads {threads:2d}: reads alone {sorted(times)[1]*1e3:.0f} ms ({', '.join(f'{x*1e3:.0f}' for x in times)})", flush=True)
