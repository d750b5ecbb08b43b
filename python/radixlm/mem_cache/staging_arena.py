"""Where the file tier's reads land: block-sized places in one page-locked, GPU-mapped host
allocation, laid out like a KV pool.

A file-tier block is the KV of `block_size` tokens, every layer: [layers, 2 (K, V), tokens,
heads, dim] in the file. The arena is a host `KVPool` of `num_blocks * block_size` rows (one
allocation; page-locked and mapped for the GPU on a GPU machine), and block b is rows
[b * block_size, (b + 1) * block_size) of each layer's K and V buffer. A file is read straight
into those rows (`pieces`: one writable view per layer and K/V, in the file's order), and a
fetch's blocks reach device slots with one launch of the tiers' copy kernel, which reads mapped
host memory directly (kv_transfer.TierCopier over the arena as its "host pool"). So a block read
from a file is copied once by the kernel and never by a host thread (before: a bytes object per
file, a slice past its header, a gather into a fresh pinned buffer, a DMA, a scatter).

A block handed to a copy goes back to the free list once the copy is done: `release` takes the
copy's CUDA event, and `acquire` reclaims blocks whose events have completed (or, asked to, waits
for the oldest). Thread-safe: the prefetch threads and the scheduler's thread share it.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

from radixlm.mem_cache.pools import KVPool


class StagingArena:
    def __init__(self, device_pool: KVPool, block_size: int, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("the staging arena needs at least one block")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pool = KVPool(num_blocks * block_size, device_pool.num_layers,
                           device_pool.num_kv_heads, device_pool.head_dim, device_pool.dtype,
                           "cpu", pin_memory=device_pool.device.type == "cuda",
                           k_scale=device_pool.k_scales, v_scale=device_pool.v_scales,
                           single_allocation=True)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Blocks handed to copies still queued on the GPU: (the copy's event, its blocks).
        self._copying: deque[tuple[torch.cuda.Event, list[int]]] = deque()
        self._lock = threading.Lock()

    @property
    def block_bytes(self) -> int:
        return self.pool.nbytes // self.num_blocks

    def available(self) -> int:
        """Blocks free now (copies seen done included)."""
        with self._lock:
            self._reclaim()
            return len(self._free)

    def acquire(self, wait: bool = False) -> int | None:
        """A free block, or None. With `wait`, if none is free but some are being copied from,
        wait on the host for the oldest such copy first."""
        with self._lock:
            self._reclaim()
            if not self._free and wait and self._copying:
                event, blocks = self._copying.popleft()
                event.synchronize()
                self._free.extend(blocks)
            return self._free.pop() if self._free else None

    def release(self, blocks: list[int], after: torch.cuda.Event | None = None) -> None:
        """Give blocks back: now, or once `after` (a copy reading them) has completed."""
        if not blocks:
            return
        with self._lock:
            if after is None:
                self._free.extend(blocks)
            else:
                self._copying.append((after, list(blocks)))

    def _reclaim(self) -> None:
        while self._copying and self._copying[0][0].query():
            self._free.extend(self._copying.popleft()[1])

    def pieces(self, block: int) -> list[memoryview]:
        """Block `block`'s rows as writable byte views in the file's order: layer 0's K, its V,
        layer 1's K, ... (what a file's payload is, after its header)."""
        rows = slice(block * self.block_size, (block + 1) * self.block_size)
        return [memoryview(buf[rows].view(torch.uint8).numpy()).cast("B")
                for buf in self.pool.buffers()]

    def rows(self, blocks: list[int], skip: int = 0) -> list[int]:
        """The arena rows of `blocks`' tokens in order, the first block's first `skip` left
        out (the tokens the tree already holds)."""
        bs = self.block_size
        out = [b * bs + i for b in blocks for i in range(bs)]
        return out[skip:]
