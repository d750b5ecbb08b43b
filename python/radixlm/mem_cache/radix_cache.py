"""RadixAttention's prefix index: a radix tree over token ids whose nodes hold KV slot indices.

Every finished (and every partly prefilled) request leaves its tokens' KV in the tree, so a later
request that starts with the same tokens reuses them instead of recomputing. Nodes referenced by
running requests are locked (lock_ref > 0); only unlocked leaves are evicted, least recently used
first.

Accounting: every usable KV slot is in exactly one of four states, and tests check
    free (allocator) + evictable (unlocked tree) + protected (locked tree) + owned by requests
    == total.

With page_size P > 1 the tree stores whole pages only: keys are compared and split at multiples
of P, a match is rounded down to a page boundary, and a request keeps its partial last page.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.pools import ReqToTokenPool
from radixlm.mem_cache.prefix_cache import CachedRequest, MatchResult, PrefixCache

_clock = itertools.count()  # monotonic "time" for LRU; cheaper and steadier than time.monotonic()


@dataclass(eq=False)
class TreeNode:
    key: list[int] = field(default_factory=list)
    value: torch.Tensor | None = None          # KV slots, same length as key
    parent: "TreeNode | None" = None
    children: dict = field(default_factory=dict)  # first token (or first page tuple) -> child
    lock_ref: int = 0
    last_access: int = field(default_factory=lambda: next(_clock))
    # The hierarchical cache's host tier (hiradix_cache.py): host slots holding a copy of this
    # node's KV (value is None when the node lives on the host only), and how often it was hit.
    host_value: torch.Tensor | None = None
    hit_count: int = 0

    def __lt__(self, other: "TreeNode") -> bool:  # for the eviction heap
        return self.last_access < other.last_access


class RadixCache(PrefixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: KVAllocator):
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.device = allocator.device
        self.reset()

    # ---------------------------------------------------------------- sizes

    def reset(self) -> None:
        """Drop the whole tree (flush_cache). The caller frees the allocator separately."""
        self.root = TreeNode(value=torch.empty(0, dtype=torch.int64, device=self.device))
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    # ---------------------------------------------------------------- keys

    def _child_key(self, key: Sequence[int]):
        return key[0] if self.page_size == 1 else tuple(key[:self.page_size])

    def _match_len(self, a: Sequence[int], b: Sequence[int]) -> int:
        # Binary search on slice equality: list comparisons run in C, so matching a 4k-token
        # prompt costs microseconds where a per-token Python loop costs a fraction of a ms.
        lo, hi = 0, min(len(a), len(b))
        if a[:hi] == b[:hi]:
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo - lo % self.page_size

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    # ---------------------------------------------------------------- lookup

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `key` (page aligned). Splits a node when the match ends inside
        it so that the returned last_node covers exactly the match."""
        path = self._walk(key)
        if path:
            indices = torch.cat([n.value for n in path])
        else:
            indices = torch.empty(0, dtype=torch.int64, device=self.device)
        return MatchResult(indices=indices, last_node=path[-1] if path else self.root)

    def _walk(self, key: Sequence[int]) -> list[TreeNode]:
        """The nodes that match `key` from the root, the last one split to end with the match;
        each is marked as used now."""
        key = list(key[:self._aligned(len(key))])
        node, path = self.root, []
        now = next(_clock)
        node.last_access = now
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            n = self._match_len(child.key, key)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            path.append(child)
            node, key = child, key[n:]
        return path

    def peek_prefix(self, key: Sequence[int]) -> tuple[int, TreeNode]:
        """(length of the longest cached prefix of `key`, the deepest node it reaches), without
        side effects: no node is split and no access time changes, so a scheduling policy can
        sort the waiting queue without reshaping the tree or the LRU order. When the match ends
        inside a node, that node is returned (the request shares part of its key)."""
        path = self._peek_path(key)
        return sum(n for _, n in path), (path[-1][0] if path else self.root)

    def _peek_path(self, key: Sequence[int]) -> list[tuple[TreeNode, int]]:
        """The nodes `key` runs through, each with how many of its tokens match (the last one
        possibly fewer than its key), without side effects."""
        key = key[:self._aligned(len(key))]
        node, matched, path = self.root, 0, []
        while matched < len(key):
            child = node.children.get(self._child_key(key[matched:]))
            if child is None:
                break
            n = self._match_len(child.key, key[matched:])
            if n == 0:
                break
            matched += n
            node = child
            path.append((child, n))
            if n < len(child.key):
                break
        return path

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` so that its first n tokens become a new parent node; return that node.
        (A node of the hierarchical cache's host tier has no device slots: value None.)"""
        parent = child.parent
        assert parent is not None
        value = child.value
        mid = TreeNode(key=child.key[:n], value=None if value is None else value[:n],
                       parent=parent, lock_ref=child.lock_ref, last_access=child.last_access)
        parent.children[self._child_key(mid.key)] = mid
        child.key, child.value = child.key[n:], None if value is None else value[n:]
        child.parent = mid
        mid.children[self._child_key(child.key)] = child
        return mid

    # ---------------------------------------------------------------- insert

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Add key -> value (page-aligned part only). Returns how many leading tokens the tree
        already had: the caller owns value[:that] as duplicates and must free its own copies."""
        n_aligned = self._aligned(len(key))
        key, value = list(key[:n_aligned]), value[:n_aligned].to(torch.int64)
        node, done, already = self.root, 0, 0
        now = next(_clock)
        while done < len(key):
            rest = key[done:]
            child = node.children.get(self._child_key(rest))
            if child is None:
                new = TreeNode(key=rest, value=value[done:].clone(), parent=node, last_access=now)
                node.children[self._child_key(rest)] = new
                self.evictable_size_ += len(rest)
                self._on_new_node(new)
                return already
            n = self._match_len(child.key, rest)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            if self._has_kv(child, value[done:done + n]) and already == done:
                already += n
            done += n
            node = child
        return already

    def _has_kv(self, node: TreeNode, offered: torch.Tensor) -> bool:
        """Whether the tree already holds `node`'s KV (so the caller's `offered` slots are
        duplicates). Always here; the hierarchical cache adopts them for host-only nodes."""
        return True

    def _on_new_node(self, node: TreeNode) -> None:
        """Hook: a node was just created by insert (the hierarchical cache backs it up)."""

    # ---------------------------------------------------------------- requests

    def cache_finished_req(self, req: CachedRequest) -> None:
        """A request ended: put its KV into the tree, free what the tree already had and the
        unaligned tail, unlock its old prefix, and release its request slot."""
        self._commit(req)
        self.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.last_node = None
        req.prefix_indices = torch.empty(0, dtype=torch.int64, device=self.device)

    def cache_unfinished_req(self, req: CachedRequest, kv_len: int | None = None) -> None:
        """A prefill (or a chunk of one) finished: insert what is computed so far (the first
        kv_len tokens) and lock it, so the request's KV becomes shareable and the next chunk
        starts from the tree's copy."""
        kv_len = req.kv_allocated_len if kv_len is None else kv_len
        self._commit(req, keep_tail=True, kv_len=kv_len)
        match = self.match_prefix(req.fill_ids[:kv_len])
        n = len(match.indices)
        self.req_to_token_pool.write(req.req_pool_idx, 0, match.indices)
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(req.last_node)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        req.prefix_indices = torch.cat([match.indices, row[n:kv_len].to(torch.int64)])
        req.last_node = match.last_node

    def _commit(self, req: CachedRequest, keep_tail: bool = False,
                kv_len: int | None = None) -> None:
        kv_len = req.kv_allocated_len if kv_len is None else kv_len
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        slots = row[:kv_len].to(torch.int64)
        already = self.insert(req.fill_ids[:kv_len], slots)
        # Slots the request computed itself but the tree already held (another request inserted
        # the same tokens meanwhile) are duplicates; the request's own prefix came from the tree.
        own_start = self._aligned(len(req.prefix_indices))  # the rest is the request's own tail page
        if already > own_start:
            self.allocator.free(slots[own_start:already])
        if not keep_tail:
            self.allocator.free(slots[self._aligned(kv_len):])

    # ---------------------------------------------------------------- locks

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, "unlocking a node that is not locked"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    # ---------------------------------------------------------------- eviction

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, least recently used first.
        Returns how many were freed (less when not enough is evictable)."""
        heap = [n for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            self.allocator.free(leaf.value)
            freed += len(leaf.key)
            self.evictable_size_ -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def _leaves(self, counts: Callable[[TreeNode], bool] | None = None) -> list[TreeNode]:
        """Nodes with no children, or, given `counts`, with no child that counts (the
        hierarchical cache's device leaves: no device-resident child)."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            children = (node.children.values() if counts is None
                        else [c for c in node.children.values() if counts(c)])
            stack.extend(children)
            if node is not self.root and not children:
                out.append(node)
        return out

    def all_values(self) -> torch.Tensor:
        """Every device slot the tree holds (for accounting checks in tests)."""
        return self._collect("value", self.device)

    def _collect(self, attr: str, device: torch.device) -> torch.Tensor:
        """The non-None `attr` slot tensors of every node but the root, concatenated."""
        vals, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if getattr(node, attr) is not None:
                vals.append(getattr(node, attr))
        return torch.cat(vals) if vals else torch.empty(0, dtype=torch.int64, device=device)
