"""The prefix-cache interface: what the scheduler and the KV manager may ask of a cache.

Three caches implement it: RadixCache (the radix tree that shares prefixes between requests),
HiRadixCache (the same tree over device, host and optionally file tiers,
--enable-hierarchical-cache) and ChunkCache (--disable-radix-cache: a request keeps its own KV
and frees it when it ends).

Slot accounting the implementations keep: `evictable_size()` slots are cached and unlocked (the
cache may free them on `evict`), `protected_size()` slots are cached and locked by running
requests; the KV manager adds free and request-owned slots to check the total.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch


class CachedRequest(Protocol):
    """What the caches need of a request (scheduler/request.py's Req provides it)."""

    req_pool_idx: int | None
    prefix_indices: torch.Tensor
    last_node: Any
    kv_allocated_len: int

    @property
    def fill_ids(self) -> list[int]: ...


@dataclass
class MatchResult:
    indices: torch.Tensor   # KV slots of the matched prefix (int64)
    last_node: Any          # the cache's handle on the match (lock it while the request runs)


@dataclass(frozen=True)
class LoadPeek:
    """What matching a key would do in a cache with a lower tier, seen without doing it."""
    cached: int              # tokens of the cached prefix, on any tier
    to_load: int             # of those, copied back into device slots by the match
    unlocked_on_device: int  # of those on the device, unlocked (a lock would protect them)


class PrefixCache(ABC):
    # ---------------------------------------------------------------- sizes

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached prefix (flush_cache); the caller frees the allocator."""

    @abstractmethod
    def evictable_size(self) -> int: ...

    @abstractmethod
    def protected_size(self) -> int: ...

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    # ---------------------------------------------------------------- lookups

    @abstractmethod
    def peek_prefix(self, key: Sequence[int]) -> tuple[int, Any]:
        """Length of the cached prefix of `key` and its node, with no side effects (no node
        split, no LRU touch): for scheduling policies that only sort."""

    def peek_load(self, key: Sequence[int]) -> LoadPeek | None:
        """What `match_prefix(key)` would copy back into device slots from a lower tier (the
        hierarchical cache's host pool or file tier), with no side effects but a collective
        under tensor parallelism (the file tier's ranks agree on what they have); None for a
        cache that lives on the device only."""
        return None

    @property
    def has_slow_tier(self) -> bool:
        """Whether `prefetch` does anything (a tier slow enough to fetch from ahead of need)."""
        return False

    def prefetch(self, key: Sequence[int]) -> None:
        """A request with prompt `key` arrived: start fetching what a slow tier holds of it
        (the hierarchical cache's file tier), so that its match finds it in memory."""

    @abstractmethod
    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The cached prefix of `key`, page-aligned, for a request about to be admitted."""

    @abstractmethod
    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Cache `value` (KV slots) under `key`; returns how many leading tokens were already
        cached (the caller frees its duplicate slots for those)."""

    # ---------------------------------------------------------------- requests

    @abstractmethod
    def cache_finished_req(self, req: CachedRequest) -> None:
        """A request ended (or was retracted): keep its KV in the cache, release its slot row."""

    @abstractmethod
    def cache_unfinished_req(self, req: CachedRequest, kv_len: int | None = None) -> None:
        """A prefill chunk finished: cache the request's first kv_len tokens (default: all
        with KV), keep it running. A smaller kv_len leaves out tokens whose KV a step in
        flight is still writing, which the request may yet replace (jump-forward)."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None: ...

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens unlocked cached slots if possible; returns how many."""

    @abstractmethod
    def all_values(self) -> torch.Tensor:
        """Every slot the cache holds (tests check them against the allocator)."""

    def close(self) -> None:
        """The server stops: finish what must outlive it (the file tier's queued writes)."""
