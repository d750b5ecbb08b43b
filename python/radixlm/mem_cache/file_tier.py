"""The hierarchical cache's file tier (L3) as the radix tree uses it: which blocks of a key the
store holds, reading them (ahead of need, on threads) into page-locked staging memory, copying
them into device slots, and writing newly cached blocks behind the requests that made them.

The tree's side (which device slots, eviction, inserting the loaded prefix) stays in
hiradix_cache.py; the store itself (files, checksums, threads) is kv_storage.py; the staging
memory is staging_arena.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch

from radixlm.mem_cache.kv_storage import (BackgroundWriter, FileStorage, KVStorage,
                                          StoragePrefetcher, block_names)
from radixlm.mem_cache.kv_transfer import TierCopier
from radixlm.mem_cache.pools import KVPool
from radixlm.mem_cache.staging_arena import StagingArena

logger = logging.getLogger(__name__)

# Tokens per L3 block (rounded up to whole pages): big enough that a file read costs less than
# recomputing it, small enough that a shared prefix wastes little of its last block.
STORAGE_BLOCK = 64
# The staging arena's size, at most (and never larger than the device pool): what the blocks
# read ahead for waiting requests and not yet matched can take, and what a match loads from the
# store in one go (a longer prefix loads in several: 2 GiB is 16k tokens of an 8B model's KV).
# It is page-locked for the server's life.
STAGING_MAX_BYTES = 2 << 30
# The same for the blocks being written: how far the writer may fall behind (a block finds no
# room: not written now, offered again the next time its key is cached). With the read arena,
# up to 3 GiB of page-locked host memory per TP rank, never more than twice the device pool.
WRITE_STAGING_MAX_BYTES = 1 << 30


def _scales_tag(scales: list[float]) -> str:
    """A pool's per-layer scales in a file-tier namespace: the one value when every layer has
    it (the names blocks had before scales were per layer), else every layer's."""
    return repr(scales[0]) if len(set(scales)) == 1 else repr(tuple(scales))


@dataclass
class StagedBlocks:
    """Blocks of a key read from the store into the staging arena, in order."""
    blocks: list[int]          # their staging blocks
    read_ahead: int            # how many of them the prefetch threads had read (the first ones
                               # or not: a count for the metrics)
    cut_short: bool = False    # the reads stopped for want of a staging block, not at a miss


class FileTier:
    def __init__(self, directory: str, namespace: str, device_pool: KVPool, page_size: int,
                 agree_on_blocks: Callable[[int], int] | None = None):
        """`namespace`: what else names a block (the model, the TP rank; the pool's layout is
        added here). `agree_on_blocks`: under tensor parallelism, how many blocks every rank
        found (the smallest count), so that all load the same prefix."""
        self.device_pool = device_pool
        self.agree_on_blocks = agree_on_blocks
        self.storage: KVStorage = FileStorage(directory)
        # Names known to be in the store, or queued to be written there; a write that fails
        # (disk full, ...) takes its name out again, so that the block is offered again.
        self._stored: set[str] = set()
        self.block_size = -(-STORAGE_BLOCK // page_size) * page_size
        pool = device_pool
        self.block_bytes = self.block_size * KVPool.bytes_per_token(
            pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)
        self.arena = self._arena(STAGING_MAX_BYTES)
        self.copier = TierCopier(pool, self.arena.pool)
        # Blocks being written are gathered there by one copy-kernel launch for all of an
        # insert's new blocks (not a gather per layer and block on the scheduler's thread),
        # and written from there.
        self.write_arena = self._arena(WRITE_STAGING_MAX_BYTES)
        self.write_copier = TierCopier(pool, self.write_arena.pool)
        # The write arena bounds what is queued: the writer's own bounds never drop a block
        # that found room there.
        self.writer = BackgroundWriter(
            self.storage, max_pending=self.write_arena.num_blocks,
            max_pending_bytes=self.write_arena.num_blocks * self.block_bytes,
            on_failed=self._stored.discard)
        # Reads are disk / page-cache copies and a CRC32 (~3.6 GB/s a core), both outside the
        # GIL: a thread per two cores, 2 to 8.
        threads = min(8, max(2, (os.cpu_count() or 2) // 2))
        self.prefetcher = StoragePrefetcher(self.storage, self.arena, threads)
        # fp8 blocks hold scaled values: only a pool with the same scales may read them.
        scales = f"|ks{_scales_tag(pool.k_scales)}vs{_scales_tag(pool.v_scales)}" \
            if pool.is_fp8 else ""
        self.namespace = (f"{namespace}|{pool.dtype}{scales}"
                          f"|L{pool.num_layers}H{pool.num_kv_heads}D{pool.head_dim}"
                          f"|B{self.block_size}")
        self.hit_tokens = 0              # store -> device, since start (metrics, tests)
        self.prefetched_tokens = 0       # of those, in blocks read before the match

    def _arena(self, max_bytes: int) -> StagingArena:
        pool = self.device_pool
        num_blocks = max(1, min(max_bytes, pool.nbytes) // self.block_bytes)
        return StagingArena(pool, self.block_size, num_blocks)

    def names(self, key: Sequence[int]) -> list[str]:
        return block_names(self.namespace, key, self.block_size)

    def prefetch(self, key: Sequence[int], have: int) -> None:
        """Read the blocks of `key` past its first `have` tokens (what the tree holds) on the
        prefetch threads."""
        names = self.names(key)[have // self.block_size:]
        if names:
            self.prefetcher.prefetch(names)

    def peek(self, key: Sequence[int], start: int) -> int:
        """How many tokens past `start` a match would load from the store, without reading:
        the consecutive blocks of `key` from the one holding token `start` that the store has
        (a file that turns out corrupt counts here: an overestimate, which only makes the
        admission check stricter); under tensor parallelism as many as every rank has. The
        ranks are asked only where `key` has a whole block from there on, which they all
        judge alike (their trees are the same)."""
        names = self.names(key)[start // self.block_size:]
        if not names:
            return 0
        found = 0
        for name in names:
            if not self.storage.exists(name):
                break
            found += 1
        if self.agree_on_blocks is not None:
            found = self.agree_on_blocks(found)
        return max(0, found * self.block_size - start % self.block_size)

    def read(self, key: Sequence[int], start: int) -> StagedBlocks:
        """The staging blocks holding the store's consecutive blocks of `key` from the one
        containing token `start` on: as many as the store has, or as fit the arena now (the
        caller copies them in and asks again from where they end); under tensor parallelism
        as many as every rank found. The caller copies them in (`copy_in`) or gives them back
        (`release`)."""
        names = self.names(key)[start // self.block_size:]
        keep = set(names)         # (this request's: not taken from its own read-ahead)
        staged = StagedBlocks([], 0)
        for i, name in enumerate(names):
            block = self.prefetcher.take(name)
            if block is not None:
                staged.read_ahead += 1
            else:
                block = self._free_block(keep)
                if block is None:
                    staged.cut_short = True
                    break
                if not self._read_into(name, block):
                    self._drop_unreachable(names[i:])
                    break
            staged.blocks.append(block)
            self._stored.add(name)
        if self.agree_on_blocks is not None:   # every rank calls it, found or not
            agreed = self.agree_on_blocks(len(staged.blocks))
            self.arena.release(staged.blocks[agreed:])
            staged.read_ahead = min(staged.read_ahead, agreed)
            del staged.blocks[agreed:]
        return staged

    def release(self, staged: StagedBlocks) -> None:
        self.arena.release(staged.blocks)

    def _free_block(self, keep: set[str]) -> int | None:
        """A staging block for a read on this thread: a free one, else one a read ahead for
        another request gives up, else one a queued copy frees (a host wait); None if no
        staging block is left."""
        block = self.arena.acquire()
        if block is None:
            block = self.prefetcher.give_way(keep)
        if block is None:
            block = self.arena.acquire(wait=True)
        return block

    def _read_into(self, name: str, block: int) -> bool:
        """Read a block on this thread into staging block `block`; False (and the block given
        back) if it is not in the store or unreadable: a miss, never an exception, so that
        the ranks' agreement is always reached."""
        try:
            found = self.storage.get_into(name, self.arena.pieces(block))
        except Exception:
            logger.exception("reading KV block %s failed", name)
            found = False
        if not found:
            self.arena.release([block])
        return found

    def copy_in(self, staged: StagedBlocks, skip: int, slots: torch.Tensor) -> None:
        """Copy the staged blocks' tokens, less the first block's first `skip`, into device
        slots `slots` (one kernel reading the mapped staging memory, on the compute stream),
        and give the blocks back once the copy is done."""
        rows = self._rows_on(slots.device, self.arena.rows(staged.blocks, skip))
        self.copier.to_device(rows, slots)
        self.arena.release(staged.blocks, after=self._copied())
        self.hit_tokens += len(slots)
        self.prefetched_tokens += min(staged.read_ahead * self.block_size, len(slots))

    def _drop_unreachable(self, names: list[str]) -> None:
        """`names[0]` could not be read (absent, or corrupt and so removed): the blocks after it
        in the chain can no longer be matched. They are removed and forgotten, so that the
        prefix computed again writes them anew: the writer skips names whose file exists, and
        a corrupt block the reads never reached would otherwise stay a miss for good."""
        for name in names:
            self._stored.discard(name)
        for name in names[1:]:
            self.storage.remove(name)

    def store(self, key: list[int], value: torch.Tensor) -> None:
        """Queue every whole block of a freshly cached key (`value`: its device slots) that the
        store does not have yet, as far as the write staging has room (the rest is offered
        again the next time the key is cached)."""
        bs = self.block_size
        todo: list[tuple[str, int]] = []        # (name, write staging block)
        slots: list[torch.Tensor] = []
        for i, name in enumerate(self.names(key)):
            if name in self._stored:
                continue
            block = self.write_arena.acquire()
            if block is None:
                break           # (the writer is behind)
            todo.append((name, block))
            slots.append(value[i * bs:(i + 1) * bs])
            self._stored.add(name)      # (before the write can fail and take it out)
        if not todo:
            return
        blocks = [block for _, block in todo]
        try:
            self.write_copier.to_host(torch.cat(slots), self._rows_on(
                value.device, self.write_arena.rows(blocks)))
        except BaseException:
            # (nothing queued: the blocks go back, and their names are offered again)
            for name, _ in todo:
                self._stored.discard(name)
            self.write_arena.release(blocks)
            raise
        copied = self._copied()
        for k, (name, block) in enumerate(todo):
            if not self.writer.submit(name, self._pieces_when_copied(block, copied),
                                      self.block_bytes, partial(self._written, block, copied)):
                for name_left, _ in todo[k:]:
                    self._stored.discard(name_left)
                self.write_arena.release(blocks[k:], after=copied)
                break

    def _pieces_when_copied(self, block: int, copied: torch.cuda.Event | None
                            ) -> Callable[[], list[memoryview]]:
        """What the writer thread writes for `block`: its pieces, once the copy into them is
        done (waited for there, not on the scheduler's thread)."""
        def wait_and_read() -> list[memoryview]:
            if copied is not None:
                with torch.cuda.device(self.device_pool.device):   # (the thread's may differ)
                    copied.synchronize()
            return self.write_arena.pieces(block)
        return wait_and_read

    def _written(self, block: int, copied: torch.cuda.Event | None) -> None:
        # (after the copy: a write skipped because the file exists never waited for it)
        self.write_arena.release([block], after=copied)

    def _rows_on(self, device: torch.device, rows: list[int]) -> torch.Tensor:
        """Staging rows as the copy kernel's index tensor on `device`."""
        t = torch.tensor(rows, dtype=torch.int64)
        if device.type != "cuda":
            return t
        # (from page-locked memory: a pageable copy would make the host wait for the GPU)
        return t.pin_memory().to(device, non_blocking=True)

    def _copied(self) -> torch.cuda.Event | None:
        """An event after the copies queued so far (None on the CPU: they are done)."""
        if self.device_pool.device.type != "cuda":
            return None
        done = torch.cuda.Event(blocking=True)   # (a host that waits for it sleeps)
        done.record()
        return done

    def close(self) -> None:
        self.prefetcher.close()
        self.writer.flush()
