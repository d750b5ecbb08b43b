"""Where the file tier's reads land, and where its writes are gathered (a second arena):
block-sized places in one page-locked, GPU-mapped host allocation, laid out like a KV pool.

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
for the oldest). Thread-safe: the prefetch threads (or the writer thread, which gives a block
back once it is written) and the scheduler's thread share it. (The
tiers' copy kernel's warm-up in TierCopier writes row 0 once, before any read.)
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
        self.device = device_pool.device      # (whose stream the copies from the arena run on)
        self.pool = KVPool(num_blocks * block_size, device_pool.num_layers,
                           device_pool.num_kv_heads, device_pool.head_dim, device_pool.dtype,
                           "cpu", pin_memory=device_pool.device.type == "cuda",
                           k_scale=device_pool.k_scales, v_scale=device_pool.v_scales,
                           single_allocation=True)
        # Every byte of the one allocation as a memoryview, and where each layer's K / V buffer
        # starts in it: a block's pieces are slices of it. (Made per read with tensor views
        # instead, they cost ~0.25 ms of the GIL a block, 4-6 ms with 8 reading threads
        # waiting for it: 0.55 s of an 8k-token fetch of an 8B model.)
        storage = self.pool.k_buffers[0].untyped_storage()
        whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        self._bytes = memoryview(whole.numpy())
        self._starts = [b.data_ptr() - storage.data_ptr() for b in self.pool.buffers()]
        self._piece_bytes = block_size * self.pool.buffers()[0][0].nbytes
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Blocks handed to copies still queued on the GPU: (the copy's event, its blocks).
        self._copying: deque[tuple[torch.cuda.Event, list[int]]] = deque()
        self._lock = threading.Lock()

    def available(self) -> int:
        """Blocks free now (copies seen done included)."""
        with self._lock:
            self._reclaim()
            return len(self._free)

    def acquire(self, wait: bool = False) -> int | None:
        """A free block, or None. With `wait`, if none is free but some are being copied from,
        wait on the host for the oldest such copy first (outside the lock)."""
        with self._lock:
            self._reclaim()
            if self._free or not (wait and self._copying):
                return self._free.pop() if self._free else None
            event, blocks = self._copying.popleft()
        with torch.cuda.device(self.device):
            event.synchronize()
        with self._lock:
            self._free.extend(blocks)
            return self._free.pop()

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
        if not self._copying:
            return
        # (the callers include the prefetch threads, whose current device may be another:
        # under tensor parallelism a rank's scheduler thread alone sets its GPU)
        with torch.cuda.device(self.device):
            while self._copying and self._copying[0][0].query():
                self._free.extend(self._copying.popleft()[1])

    def pieces(self, block: int) -> list[memoryview]:
        """Block `block`'s rows as writable byte views in the file's order: layer 0's K, its V,
        layer 1's K, ... (what a file's payload is, after its header)."""
        first = block * self._piece_bytes
        return [self._bytes[start + first:start + first + self._piece_bytes]
                for start in self._starts]

    def rows(self, blocks: list[int], skip: int = 0) -> list[int]:
        """The arena rows of `blocks`' tokens in order, the first block's first `skip` left
        out (the tokens the tree already holds)."""
        bs = self.block_size
        out = [b * bs + i for b in blocks for i in range(bs)]
        return out[skip:]
