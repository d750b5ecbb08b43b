"""The file tier's reads on the scheduler's thread, with and without the prefetch thread
(issue 15). 32 blocks of 8 MiB (64 tokens of a Llama-3.1-8B-shaped KV each, 2,048 tokens) in a
temporary directory (page cache hot): the time a match spends reading and checksumming them
itself, against taking them once `StoragePrefetcher` has read them. From the repo root:

    PYTHONPATH=python python benchmarks/results/issue15/prefetch/prefetch_cpu.py
"""
import os
import tempfile
import time

from radixlm.mem_cache.kv_storage import FileStorage, StoragePrefetcher

store = FileStorage(tempfile.mkdtemp())
block = os.urandom(8 << 20)
names = [f"{i:064x}" for i in range(32)]
for name in names:
    store.set(name, block)
start = time.perf_counter()
for name in names:
    assert store.get(name) is not None
on_caller = time.perf_counter() - start
prefetcher = StoragePrefetcher(store, 1 << 30)
prefetcher.prefetch(names)
prefetcher.wait_idle()
start = time.perf_counter()
for name in names:
    assert prefetcher.take(name) is not None
taken = time.perf_counter() - start
print(f"32 blocks x 8 MiB (2,048 tokens of 8B KV): read + checksum on the caller "
      f"{on_caller * 1e3:.0f} ms; taken after the prefetch {taken * 1e3:.1f} ms")
