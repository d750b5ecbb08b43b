"""Reads alone (prefetch of 8k tokens, 8B-shaped bf16 KV, 8 threads), after the GIL fix: a
readinto per piece (the code then) or one os.preadv per block, with SHA-256 or CRC32 as the
checksum. It ran against the tree between 15d7474 and e91a7b4 (write staging applied, files
still SHA-256 with kv_storage.HEAD / MAGIC, which e91a7b4 replaced): a record of that
experiment, not runnable on later code. PYTHONPATH=python python <this> [--device cuda]"""
import hashlib, os, sys, tempfile, time, zlib
import torch
from radixlm.mem_cache import kv_storage
from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
TOKENS = 8192 if DEVICE == "cuda" else 1024


class Crc:
    def __init__(self, data=b""):
        self.c = zlib.crc32(data)
    def update(self, d):
        self.c = zlib.crc32(d, self.c)
    def digest(self):
        return self.c.to_bytes(4, "little") * 8


class H:   # a hashlib stand-in for kv_storage
    sha256 = None


readinto_get_into = kv_storage.FileStorage.get_into


def preadv_get_into(self, name, pieces):
    size = sum(p.nbytes for p in pieces)
    try:
        fd = os.open(self._path(name), os.O_RDONLY)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size != kv_storage.HEAD + size:
            return False
        head = bytearray(kv_storage.HEAD)
        if os.preadv(fd, [head], 0) != kv_storage.HEAD or not head.startswith(kv_storage.MAGIC):
            return False
        if os.preadv(fd, pieces, kv_storage.HEAD) != size:
            return False
    finally:
        os.close(fd)
    digest = kv_storage.hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.digest() == head[len(kv_storage.MAGIC):]


def cache(d, slots):
    pool = KVPool(slots, 32, 8, 128, torch.bfloat16, DEVICE)
    alloc = KVAllocator(slots, 1, DEVICE)
    c = HiRadixCache(ReqToTokenPool(2, slots, DEVICE), alloc, pool,
                     HiCacheConfig(ratio=0.01, storage_dir=d, storage_namespace="b"))
    return c, pool, alloc


tokens = list(range(1000, 1000 + TOKENS))
for sum_name, impl in (("sha256", hashlib.sha256), ("crc32", Crc)):
    H.sha256 = impl
    kv_storage.hashlib = H
    d = tempfile.mkdtemp()
    first, pool, alloc = cache(d, TOKENS + 64)
    s = alloc.alloc(TOKENS)
    for b in pool.buffers():
        b.normal_()
    first.insert(tokens, s)
    first.close()
    del first, pool
    for read_name, fn in (("readinto", readinto_get_into), ("preadv", preadv_get_into)) * 2:
        kv_storage.FileStorage.get_into = fn
        times = []
        for _ in range(3):
            c, _, _ = cache(d, TOKENS + 64)
            t = time.perf_counter()
            c.prefetch(tokens + [1])
            c.file_tier.prefetcher.wait_idle()
            times.append(time.perf_counter() - t)
            assert c.file_tier.prefetcher.held == TOKENS // 64, c.file_tier.prefetcher.held
            c.close()
        print(f"{sum_name:7s} {read_name:9s}: reads alone {sorted(times)[1]*1e3:.0f} ms "
              f"({', '.join(f'{x*1e3:.0f}' for x in times)})", flush=True)
