"""The prefix cache used with --disable-radix-cache: the PrefixCache interface, sharing nothing.

A request keeps its own KV while it runs (across prefill chunks) and frees all of it when it ends.
"""

from __future__ import annotations

from typing import Sequence

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.pools import ReqToTokenPool
from radixlm.mem_cache.prefix_cache import CachedRequest, MatchResult, PrefixCache
from radixlm.mem_cache.radix_cache import TreeNode


class ChunkCache(PrefixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVAllocator):
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.device = allocator.device
        self._root = TreeNode()

    def reset(self) -> None:
        pass

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def peek_prefix(self, key: Sequence[int]) -> tuple[int, TreeNode]:
        return 0, self._root

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        return MatchResult(indices=torch.empty(0, dtype=torch.int64, device=self.device),
                           last_node=self._root)

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        return 0

    def cache_finished_req(self, req: CachedRequest) -> None:
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.allocator.free(row[:req.kv_allocated_len].to(torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None
        req.prefix_indices = torch.empty(0, dtype=torch.int64, device=self.device)

    def cache_unfinished_req(self, req: CachedRequest, kv_len: int | None = None) -> None:
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        req.prefix_indices = row[:req.kv_allocated_len if kv_len is None else kv_len].to(
            torch.int64)

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        pass

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def all_values(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)
