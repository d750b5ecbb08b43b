"""KVCacheManager: the one owner of KV memory bookkeeping.

It holds the three pieces that must agree: the slot allocator, the req-to-token table (which
slots each running request's tokens use) and the prefix cache over them (radix tree, or the
chunk cache with --disable-radix-cache). It hands out slots (evicting from the prefix cache
when the allocator runs dry) and checks the accounting invariant

    free + evictable + protected + owned by requests == total

It creates the allocator and the table from a MemoryPlan (sized by the model runner, which knows
the device memory left after loading the weights). The KV tensors themselves stay with the model
runner; this class only decides which slots they use. It knows nothing of requests beyond the
numbers passed in (the scheduler's Req sits above this package).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.chunk_cache import ChunkCache
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool
from radixlm.mem_cache.prefix_cache import PrefixCache
from radixlm.mem_cache.radix_cache import RadixCache
from radixlm.utils.device import to_device


class OutOfKVMemory(RuntimeError):
    pass


@dataclass(frozen=True)
class MemoryPlan:
    """How much KV memory there is: num_slots token slots in pages of page_size (page 0 is the
    padding page, never handed out), and one req-to-token row per running request."""

    num_slots: int
    page_size: int
    max_running_requests: int
    max_context_len: int      # columns of the req-to-token table

    @property
    def max_total_num_tokens(self) -> int:
        return self.num_slots - self.page_size

    @property
    def req_slots(self) -> int:
        """Rows of the req-to-token table: one per running request, plus row 0 that padded CUDA
        graph rows read."""
        return self.max_running_requests + 1


class KVCacheManager:
    def __init__(self, allocator: KVAllocator, req_to_token_pool: ReqToTokenPool,
                 radix: bool = True, hicache: tuple[HiCacheConfig, KVPool] | None = None):
        """`hicache`: the host tier's settings and the device KV pool it copies from and to
        (the hierarchical radix cache; needs `radix`)."""
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.radix = radix
        self.prefix_cache: PrefixCache
        if hicache is not None and radix:
            config, device_pool = hicache
            self.prefix_cache = HiRadixCache(req_to_token_pool, allocator, device_pool, config)
        else:
            cache_cls = RadixCache if radix else ChunkCache
            self.prefix_cache = cache_cls(req_to_token_pool, allocator)

    @classmethod
    def create(cls, plan: MemoryPlan, device: torch.device | str, radix: bool = True,
               hicache: tuple[HiCacheConfig, KVPool] | None = None) -> "KVCacheManager":
        return cls(KVAllocator(plan.num_slots, plan.page_size, device),
                   ReqToTokenPool(plan.req_slots, plan.max_context_len, device), radix=radix,
                   hicache=hicache)

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    @property
    def total_size(self) -> int:
        return self.allocator.total_size

    def available_size(self) -> int:
        """Slots new tokens can get: free ones plus what the prefix cache could evict."""
        return self.allocator.available_size() + self.prefix_cache.evictable_size()

    def flush(self) -> None:
        """Forget every cached prefix and free every slot (no request may be running)."""
        self.prefix_cache.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()

    # ------------------------------------------------------------------ allocation

    def alloc_extend(self, req_row: int, committed: int, num_tokens: int,
                     what: str) -> torch.Tensor:
        """Slots for the next num_tokens tokens of the request in table row req_row, which has
        `committed` tokens' KV already (its partial last page is filled first)."""
        alloc = self.allocator
        # Only a paged pool continues the request's last page, whose slot is read back from the
        # device (a synchronisation: with page size 1 nothing is read).
        last_loc = -1
        if committed > 0 and alloc.page_size > 1:
            last_loc = int(self.req_to_token_pool.req_to_token[req_row, committed - 1])
        locs = alloc.alloc_extend(committed, last_loc, num_tokens)
        if locs is None:
            short = alloc.pages_needed(committed, num_tokens) * alloc.page_size \
                - alloc.available_size()
            self.prefix_cache.evict(short)
            locs = alloc.alloc_extend(committed, last_loc, num_tokens)
        if locs is None:
            raise OutOfKVMemory(f"no KV memory for {num_tokens} tokens of {what}")
        return locs

    def alloc_decode(self, req_idx: torch.Tensor, pos_t: torch.Tensor, positions: list[int],
                     starts: list[int] | None = None) -> torch.Tensor:
        """One slot per decode row, for the token at positions[i], without reading anything
        back from the device. A request may have several consecutive rows (jump-forward
        tokens); starts[i] is the first position its rows compute this step (default: one row
        per request, starts == positions). With page size P a row continues a page unless its
        position starts a new one (known on the host): a page begun in an earlier step is found
        on the device in req_to_token, one begun this step is the fresh page of an earlier row."""
        alloc = self.allocator
        ps = alloc.page_size
        new_rows = [i for i, p in enumerate(positions) if p % ps == 0]
        short = len(new_rows) * ps - alloc.available_size()
        if short > 0:
            self.prefix_cache.evict(short)
        fresh = alloc.alloc(len(new_rows) * ps)
        if fresh is None:
            raise OutOfKVMemory(f"no KV memory for a decode step of {len(positions)} rows")
        if ps == 1:
            return fresh
        table = self.req_to_token_pool.req_to_token
        offset = pos_t % ps
        locs = table[req_idx, pos_t - offset].to(torch.int64) + offset
        if new_rows:
            # Rows inside a page begun this step: that page's first row is `offset` rows back.
            page_of_row = {row: j for j, row in enumerate(new_rows)}
            rows, pages = [], []
            for i, p in enumerate(positions):
                first = p - p % ps
                if first >= (starts[i] if starts is not None else p):
                    rows.append(i)
                    pages.append(page_of_row[i - p % ps])
            idx = to_device(rows + pages, torch.int64, locs.device)
            n = len(rows)
            locs[idx[:n]] = fresh[::ps][idx[n:]] + offset[idx[:n]]
        return locs

    def reorder_slots(self, req_row: int, start: int, order: list[int]) -> None:
        """Permute the slots of a request's positions start .. start + len(order) - 1:
        position start + i takes the slot of position start + order[i] (a verified tree of
        drafts keeps its accepted nodes, which it wrote in node order). Slots are single
        tokens here (trees need page size 1), so nothing is copied but the slot numbers."""
        assert self.page_size == 1, "draft trees need page size 1"
        table = self.req_to_token_pool.req_to_token
        src = to_device([start + j for j in order], torch.int64, table.device)
        table[req_row, start:start + len(order)] = table[req_row, src]

    def release_tails(self, tails: list[tuple[int, int, int]]) -> None:
        """For each (req_row, keep, allocated), give back the slots of the request's positions
        [keep, allocated) (jump-forward replaced those tokens, or a verify step rejected
        those drafts). Pages wholly past `keep` are
        freed; the page holding position keep stays the request's (its slots are overwritten
        by the recomputed tokens). The slots may still be written by a step in flight: stream
        order puts that write before any new owner's. One free for the whole step's jumps
        when pages are single tokens (each free is a few device ops)."""
        ps = self.page_size
        table = self.req_to_token_pool.req_to_token
        pieces = []
        for req_row, keep, allocated in tails:
            first = -(-keep // ps) * ps
            if first < allocated:
                pieces.append(table[req_row, first:allocated].to(torch.int64))
        if ps == 1 and pieces:
            self.allocator.free(pieces[0] if len(pieces) == 1 else torch.cat(pieces))
        elif pieces:  # a tail's pages start at multiples of ps only within its own piece
            for piece in pieces:
                self.allocator.free(piece)

    # ------------------------------------------------------------------ accounting

    def check_invariant(self, holders: Iterable[tuple[int, int]]) -> None:
        """free + evictable + protected + owned == total, where `holders` lists, for each
        request holding KV, (tokens with KV, tokens of its matched cached prefix). The part of
        a request's prefix that lives in the radix tree is counted there, not as owned."""
        ps, cache = self.page_size, self.prefix_cache
        owned = 0
        for committed, prefix_len in holders:
            tree_part = prefix_len - prefix_len % ps if self.radix else 0
            owned += -(-(committed - tree_part) // ps) * ps
        free = self.allocator.available_size()
        total = free + cache.evictable_size() + cache.protected_size() + owned
        if total != self.total_size:
            raise AssertionError(
                f"KV accounting broken: free {free} + evictable {cache.evictable_size()} + "
                f"protected {cache.protected_size()} + owned {owned} != total {self.total_size}")
        if isinstance(cache, HiRadixCache):
            cache.check_host_invariant()
