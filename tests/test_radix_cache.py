"""Tests for RadixCache and ChunkCache.

Two layers:
  * unit tests pin down the tree operations one at a time (match, split, insert, page alignment,
    LRU eviction, locking, reset);
  * a hypothesis state machine drives the caches exactly the way the scheduler does (admit with
    match_prefix + lock, extend with alloc_extend and evict-on-OOM, chunked prefill with
    cache_unfinished_req, finish/abort/retract with cache_finished_req, stray evictions) and checks
    after every step that no KV slot leaks, is double-owned, or is handed out while someone still
    reads it.

The KV contents story: every computed token writes a fake "KV value" (a hash of its whole prefix)
into its slot. Prefix reuse is correct exactly when a slot returned by match_prefix holds the
value the request would have computed itself, and the tests check that on every match and for
every slot a running request or the tree holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.chunk_cache import ChunkCache
from radixlm.mem_cache.pools import ReqToTokenPool
from radixlm.mem_cache.radix_cache import RadixCache, TreeNode


# ====================================================================== helpers


def kv_chain(tokens: list[int]) -> list[int]:
    """value[i] = the fake KV of token i, a function of tokens[:i+1] (like real K/V, which depend
    on the whole prefix through attention). Hashes of int tuples are not salted, so this is
    deterministic across runs."""
    out, h = [], 0
    for t in tokens:
        h = hash((h, t))
        out.append(h)
    return out


@dataclass(eq=False)
class FakeReq:
    """The fields the caches read and write (scheduler/request.py's Req has the same names)."""

    fill_ids: list[int]
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: TreeNode | None = None
    kv_allocated_len: int = 0
    # test bookkeeping only
    rid: int = 0
    read_slots: set[int] = field(default_factory=set)  # slots it reads from the shared tree


class Harness:
    """A faithful miniature of the scheduler's use of the memory pools and the cache, plus the
    global invariant checks. Shared by the unit tests and the state machine."""

    def __init__(self, page_size: int, num_pages: int, radix: bool, max_reqs: int = 5,
                 max_ctx: int = 48):
        self.page_size = page_size
        self.radix = radix
        self.allocator = KVAllocator(num_pages * page_size, page_size, "cpu")
        self.pool = ReqToTokenPool(max_reqs, max_ctx, "cpu")
        self.cache: RadixCache | ChunkCache = (
            RadixCache(self.pool, self.allocator) if radix else ChunkCache(self.pool, self.allocator))
        self.kv: list[int | None] = [None] * (num_pages * page_size)  # the fake KV pool
        self.running: list[FakeReq] = []
        self.next_rid = 0
        self.max_ctx = max_ctx

    # ---------------------------------------------------------------- scheduler actions

    def admit(self, prompt: list[int], first_chunk: int) -> FakeReq | None:
        """Admission: match, lock, take a request slot, then prefill the first chunk."""
        assert self.pool.available_size() > 0
        m = self.cache.match_prefix(prompt)
        self.check_match(prompt, m.indices)
        self.cache.inc_lock_ref(m.last_node)
        req = FakeReq(fill_ids=list(prompt), rid=self.next_rid)
        self.next_rid += 1
        req.req_pool_idx = self.pool.alloc()
        assert req.req_pool_idx is not None
        self.pool.write(req.req_pool_idx, 0, m.indices)
        req.prefix_indices = m.indices
        req.last_node = m.last_node
        req.kv_allocated_len = len(m.indices)
        req.read_slots = set(m.indices.tolist())
        self.running.append(req)
        k = min(first_chunk, len(prompt) - req.kv_allocated_len)
        if k > 0 and not self.extend(req, k, []):
            return None  # aborted: not even the first chunk fits
        return req

    def extend(self, req: FakeReq, k: int, new_tokens: list[int]) -> bool:
        """Compute KV for k more tokens (prefill chunk or decode). Tokens beyond fill_ids are
        decode outputs, taken from new_tokens. Returns False when the request had to be retracted
        for lack of memory."""
        kv_len = req.kv_allocated_len
        k = min(k, self.max_ctx - kv_len)
        if k <= 0:
            return True
        missing = kv_len + k - len(req.fill_ids)
        if missing > 0:
            assert len(new_tokens) >= missing
            req.fill_ids.extend(new_tokens[:missing])
        row = self.pool.req_to_token[req.req_pool_idx]
        last_loc = row[kv_len - 1] if kv_len > 0 else -1  # a 0-d tensor, like the scheduler's
        locs = self._alloc_extend(kv_len, last_loc, k)
        if locs is None:
            # Retract: give everything back through the normal exit path.
            self.finish(req)
            return False
        self.check_fresh_slots(req, kv_len, locs)
        self.pool.write(req.req_pool_idx, kv_len, locs)
        values = kv_chain(req.fill_ids[:kv_len + k])
        for i, s in enumerate(locs.tolist()):
            self.kv[s] = values[kv_len + i]
        req.kv_allocated_len = kv_len + k
        return True

    def _alloc_extend(self, kv_len: int, last_loc, k: int) -> torch.Tensor | None:
        locs = self.allocator.alloc_extend(seq_len=kv_len, last_loc=last_loc, num_tokens=k)
        if locs is None:
            needed = self.allocator.pages_needed(kv_len, k) * self.page_size
            before = self.allocator.available_size()
            freed = self.cache.evict(needed)
            assert self.allocator.available_size() - before == freed
            locs = self.allocator.alloc_extend(seq_len=kv_len, last_loc=last_loc, num_tokens=k)
        return locs

    def unfinished(self, req: FakeReq) -> None:
        kv_len = req.kv_allocated_len
        self.cache.cache_unfinished_req(req)
        row = self.pool.req_to_token[req.req_pool_idx, :kv_len].to(torch.int64)
        assert req.kv_allocated_len == kv_len
        assert torch.equal(req.prefix_indices, row), "prefix_indices disagree with the row"
        if self.radix:
            # Everything page-aligned is now shared through the tree and locked by this request.
            n = kv_len - kv_len % self.page_size
            assert self.node_depth(req.last_node) == n
            req.read_slots |= set(row[:n].tolist())

    def finish(self, req: FakeReq) -> None:
        idx = req.req_pool_idx
        self.cache.cache_finished_req(req)
        assert req.req_pool_idx is None and req.last_node is None
        assert idx in self.pool._free
        self.running.remove(req)

    def evict(self, n: int) -> int:
        before, ev = self.allocator.available_size(), self.cache.evictable_size()
        freed = self.cache.evict(n)
        assert self.allocator.available_size() - before == freed
        if self.radix:
            # Whole leaves go, so it may overshoot n, but never beyond what was evictable.
            assert freed <= ev
            assert freed >= min(n, ev), f"evict({n}) freed only {freed} of {ev} evictable"
        else:
            assert freed == 0
        return freed

    def drain(self) -> None:
        """Finish everything, evict everything: nothing may be left."""
        for req in list(self.running):
            self.finish(req)
        self.check()
        self.cache.evict(self.allocator.total_size + 1)
        assert self.cache.evictable_size() == 0 and self.cache.protected_size() == 0
        assert self.allocator.available_size() == self.allocator.total_size
        assert self.pool.available_size() == self.pool.size
        if self.radix:
            assert not self.cache.root.children

    # ---------------------------------------------------------------- tree views

    def walk(self) -> list[tuple[TreeNode, list[int]]]:
        """(node, tokens from the root up to and including the node) for every non-root node."""
        if not self.radix:
            return []
        out, stack = [], [(self.cache.root, [])]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                cpath = path + list(child.key)
                out.append((child, cpath))
                stack.append((child, cpath))
        return out

    def node_depth(self, node: TreeNode | None) -> int:
        d = 0
        while node is not None and node.parent is not None:
            d += len(node.key)
            node = node.parent
        return d

    def path_slots(self, node: TreeNode | None) -> list[int]:
        parts = []
        while node is not None and node.parent is not None:
            parts.append(node.value.tolist())
            node = node.parent
        return [s for p in reversed(parts) for s in p]

    def expected_match_len(self, key: list[int]) -> int:
        """Independent of match_prefix: the longest page-aligned prefix of key that some tree path
        starts with."""
        best = 0
        for _, path in self.walk():
            n = 0
            for a, b in zip(path, key):
                if a != b:
                    break
                n += 1
            best = max(best, n - n % self.page_size)
        return best

    # ---------------------------------------------------------------- checks

    def check_match(self, key: list[int], indices: torch.Tensor) -> None:
        assert indices.dtype == torch.int64
        n = len(indices)
        assert n <= len(key) and n % self.page_size == 0
        if self.radix:
            assert n == self.expected_match_len(key), "match_prefix missed a cached prefix"
        else:
            assert n == 0
        # The real correctness property of prefix reuse: the matched slots hold exactly the KV
        # this request would have computed for those tokens.
        want = kv_chain(key[:n])
        got = [self.kv[s] for s in indices.tolist()]
        assert got == want, "match_prefix returned slots whose KV belongs to another prefix"

    def check_fresh_slots(self, req: FakeReq, kv_len: int, locs: torch.Tensor) -> None:
        """Newly allocated slots must not be read by anyone: not a running request's row, not a
        prefix someone locked, not the tree."""
        ps = self.page_size
        new = set(locs.tolist())
        assert len(new) == len(locs)
        assert all(s // ps != 0 for s in new), "padding page handed out"
        for i, s in enumerate(locs.tolist()):
            assert s % ps == (kv_len + i) % ps, "slot offset within page != position in request"
        for other in self.running:
            assert not (new & other.read_slots), "a locked prefix slot was handed out again"
            row = self.pool.req_to_token[other.req_pool_idx, :other.kv_allocated_len].tolist()
            assert not (new & set(row)), "a slot in a running request's row was handed out again"
        assert not (new & set(self.cache.all_values().tolist())), "a tree slot was handed out"

    def check(self) -> None:
        ps, alloc, cache = self.page_size, self.allocator, self.cache
        nodes = self.walk()

        # --- tree shape, page alignment, KV contents and lock counts
        expected_lock: Counter = Counter()
        for req in self.running:
            node = req.last_node
            while node is not None and node.parent is not None:
                expected_lock[id(node)] += 1
                node = node.parent
        in_tree = {id(n) for n, _ in nodes}
        evictable = protected = 0
        tree_slots: list[int] = []
        for node, path in nodes:
            assert node.value is not None and node.value.dtype == torch.int64
            assert len(node.key) == len(node.value) > 0
            assert len(node.key) % ps == 0, "tree key not a whole number of pages"
            assert node.parent.children[cache._child_key(node.key)] is node
            vals = node.value.tolist()
            for j, s in enumerate(vals):
                # each page of a node is one physical page, in order
                assert s % ps == j % ps and s - j % ps == vals[j - j % ps]
            depth0 = len(path) - len(node.key)
            chain = kv_chain(path)
            assert [self.kv[s] for s in vals] == chain[depth0:], "tree slot holds wrong KV"
            assert node.lock_ref == expected_lock.get(id(node), 0), "lock_ref drifted"
            if node.lock_ref == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
            tree_slots.extend(vals)
        assert cache.evictable_size() == evictable
        assert cache.protected_size() == protected
        assert cache.total_size() == evictable + protected
        assert sorted(cache.all_values().tolist()) == sorted(tree_slots)
        assert len(tree_slots) == len(set(tree_slots)), "slot held twice by the tree"
        tree_pages = {s // ps for s in tree_slots}
        assert len(tree_pages) * ps == len(tree_slots), "a page is shared by two tree nodes"

        # --- the allocator's free list
        free = alloc.free_pages().tolist()
        assert len(free) == len(set(free)) and 0 not in free
        free_pages = set(free)
        assert not (free_pages & tree_pages), "slot both free and in the tree"

        # --- running requests
        owned_pages: set[int] = set()
        pool_rows = [r.req_pool_idx for r in self.running]
        assert len(set(pool_rows)) == len(pool_rows)
        assert self.pool.available_size() + len(self.running) == self.pool.size
        for req in self.running:
            if self.radix:
                assert req.last_node is cache.root or id(req.last_node) in in_tree, \
                    "a running request's locked node was detached from the tree"
            kv_len = req.kv_allocated_len
            row = self.pool.req_to_token[req.req_pool_idx, :kv_len].tolist()
            assert len(set(row)) == len(row)
            assert [self.kv[s] for s in row] == kv_chain(req.fill_ids[:kv_len]), \
                "a running request's KV was overwritten"
            for i, s in enumerate(row):
                assert s % ps == i % ps
            # The request reads the tree exactly through its locked path, then its own slots.
            locked = self.path_slots(req.last_node) if self.radix else []
            assert row[:len(locked)] == locked
            own = {s // ps for s in row[len(locked):]}
            assert not (own & tree_pages), "request-owned page also in the tree"
            assert not (own & free_pages), "request-owned page is free"
            assert not (own & owned_pages), "page owned by two requests"
            assert req.read_slots <= set(locked), "prefix slots it reads are not locked"
            owned_pages |= own

        # --- the accounting identity and no leaks
        assert (alloc.available_size() + cache.evictable_size() + cache.protected_size()
                + len(owned_pages) * ps) == alloc.total_size
        assert free_pages | tree_pages | owned_pages == set(range(1, alloc.num_pages)), "leak"


# ====================================================================== unit tests


def make(page_size: int = 1, num_pages: int = 64) -> Harness:
    return Harness(page_size, num_pages, radix=True)


def put(h: Harness, key: list[int]) -> torch.Tensor:
    """Insert key with fresh slots carrying the right fake KV (as a finished request would)."""
    slots = h.allocator.alloc(len(key))
    assert slots is not None
    for s, v in zip(slots.tolist(), kv_chain(key)):
        h.kv[s] = v
    already = h.cache.insert(key, slots)
    aligned = len(key) - len(key) % h.page_size
    # Give back what the tree didn't take (duplicates and the unaligned tail), like _commit does.
    if already:
        h.allocator.free(slots[:already])
    if aligned < len(key):
        h.allocator.free(slots[aligned:])
    return slots


def test_match_after_insert() -> None:
    h = make()
    slots = put(h, [1, 2, 3, 4, 5])
    m = h.cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert m.indices.tolist() == slots.tolist()
    assert m.last_node.key == [1, 2, 3, 4, 5]
    m = h.cache.match_prefix([9, 1])
    assert m.indices.numel() == 0 and m.last_node is h.cache.root
    assert h.cache.match_prefix([]).indices.numel() == 0
    assert h.cache.evictable_size() == 5 and h.cache.protected_size() == 0
    h.check()


def test_partial_match_splits_node() -> None:
    h = make()
    slots = put(h, [1, 2, 3, 4, 5])
    m = h.cache.match_prefix([1, 2, 3, 9])
    assert m.indices.tolist() == slots[:3].tolist()
    assert m.last_node.key == [1, 2, 3]
    (child,) = m.last_node.children.values()
    assert child.key == [4, 5] and child.value.tolist() == slots[3:].tolist()
    assert child.parent is m.last_node and m.last_node.parent is h.cache.root
    assert h.cache.evictable_size() == 5  # a split moves no slots
    # Matching the whole key still works through the split.
    assert h.cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == slots.tolist()
    h.check()


def test_insert_returns_already_present_length() -> None:
    h = make()
    a = put(h, [1, 2, 3])
    assert h.cache.insert([1, 2, 3], torch.tensor([7, 7, 7])) == 3
    b = h.allocator.alloc(5)
    assert b is not None
    assert h.cache.insert([1, 2, 3, 4, 5], b) == 3
    h.allocator.free(b[:3])
    for s, v in zip(b.tolist(), kv_chain([1, 2, 3, 4, 5])):
        h.kv[s] = v
    # The tree keeps its own slots for the shared part and takes the new ones for the rest.
    assert h.cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == a.tolist() + b[3:].tolist()
    c = h.allocator.alloc(3)
    assert c is not None
    assert h.cache.insert([1, 2, 7], c) == 2  # splits [1, 2, 3] at 2
    h.allocator.free(c[:2])
    for s, v in zip(c.tolist(), kv_chain([1, 2, 7])):
        h.kv[s] = v
    assert h.cache.evictable_size() == 6
    assert h.cache.insert([], torch.empty(0, dtype=torch.int64)) == 0
    h.check()


def test_insert_accepts_int32_values() -> None:
    # cache_*_req pass int64 copies of req_to_token rows, but a caller might pass the int32 row.
    h = make()
    slots = h.allocator.alloc(3)
    assert slots is not None
    h.cache.insert([1, 2, 3], slots.to(torch.int32))
    assert h.cache.match_prefix([1, 2, 3]).indices.dtype == torch.int64


def test_page_aligned_match_and_split() -> None:
    h = make(page_size=4)
    key = list(range(10))
    slots = put(h, key)
    assert h.cache.evictable_size() == 8  # the 2-token tail is not cached
    assert h.cache.match_prefix(key).indices.tolist() == slots[:8].tolist()
    assert h.cache.match_prefix(key[:7]).indices.tolist() == slots[:4].tolist()
    assert h.cache.match_prefix(key[:3]).indices.numel() == 0
    # A match that diverges inside the second page rounds down to the first page...
    m = h.cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 7])
    assert m.indices.tolist() == slots[:4].tolist()
    # ...and the split happens at the page boundary, never at token 6.
    assert m.last_node.key == [0, 1, 2, 3]
    # Inserting a sibling that diverges mid-page: shares only whole pages.
    other = [0, 1, 2, 3, 4, 5, 99, 7]
    put(h, other)
    for node, _ in h.walk():
        assert len(node.key) % 4 == 0
    assert sorted(len(c.key) for c in m.last_node.children.values()) == [4, 4]
    assert h.cache.match_prefix(other).indices.numel() == 8
    h.check()


def test_page_aligned_insert_returns_page_multiple() -> None:
    h = make(page_size=4)
    put(h, list(range(8)))
    b = h.allocator.alloc(12)
    assert b is not None
    # Tokens 0..5 agree with the tree but 6 does not, so only one page is "already present".
    assert h.cache.insert([0, 1, 2, 3, 4, 5, 50, 51, 8, 9, 10, 11], b) == 4


def test_lru_eviction_order() -> None:
    h = make()
    a, b, c = [1, 1, 1], [2, 2, 2], [3, 3, 3]
    for key in (a, b, c):
        put(h, key)
    h.cache.match_prefix(a)  # touch a: b is now the least recently used
    avail = h.allocator.available_size()
    assert h.evict(1) == 3
    assert h.allocator.available_size() == avail + 3
    assert h.cache.match_prefix(b).indices.numel() == 0
    assert h.cache.match_prefix(a).indices.numel() == 3  # touches a again
    assert h.evict(3) == 3
    assert h.cache.match_prefix(c).indices.numel() == 0
    assert h.evict(100) == 3
    assert h.cache.evictable_size() == 0 and not h.cache.root.children
    assert h.allocator.available_size() == h.allocator.total_size
    h.check()


def test_evict_cascades_to_parents_and_frees_exactly() -> None:
    h = make()
    put(h, [1, 2, 3, 4])
    put(h, [1, 2, 5, 6])  # splits: [1, 2] -> {[3, 4], [5, 6]}
    assert h.cache.evictable_size() == 6
    avail = h.allocator.available_size()
    freed = h.evict(6)
    assert freed == 6 and h.allocator.available_size() == avail + 6
    assert not h.cache.root.children
    h.check()


def test_locked_nodes_never_evicted() -> None:
    h = make()
    a = put(h, [1, 2, 3])
    put(h, [4, 5])
    m = h.cache.match_prefix([1, 2, 3])
    h.cache.inc_lock_ref(m.last_node)
    assert h.cache.protected_size() == 3 and h.cache.evictable_size() == 2
    assert h.cache.evict(100) == 2
    assert h.cache.match_prefix([1, 2, 3]).indices.tolist() == a.tolist()
    assert h.cache.evict(100) == 0
    # Splitting a locked node keeps both halves locked, and one unlock releases both.
    m2 = h.cache.match_prefix([1, 2])
    assert m2.last_node.lock_ref == 1 and h.cache.protected_size() == 3
    h.cache.dec_lock_ref(m.last_node)
    assert h.cache.protected_size() == 0 and h.cache.evictable_size() == 3
    assert h.cache.evict(100) == 3
    assert h.allocator.available_size() == h.allocator.total_size


def test_locked_descendant_protects_ancestors() -> None:
    h = make()
    put(h, [1, 2, 3, 4])
    put(h, [1, 2, 5, 6])
    m = h.cache.match_prefix([1, 2, 3, 4])
    h.cache.inc_lock_ref(m.last_node)
    # Only the unlocked sibling [5, 6] can go; [1, 2] is an ancestor of a locked node.
    assert h.cache.evict(100) == 2
    assert h.cache.protected_size() == 4
    h.cache.dec_lock_ref(m.last_node)


def test_lock_root_is_noop() -> None:
    h = make()
    h.cache.inc_lock_ref(h.cache.root)
    h.cache.dec_lock_ref(h.cache.root)
    h.cache.inc_lock_ref(None)
    h.cache.dec_lock_ref(None)
    assert h.cache.protected_size() == 0


def test_reset() -> None:
    h = make()
    put(h, [1, 2, 3])
    h.cache.reset()
    h.allocator.clear()  # reset() leaves the allocator to the caller
    assert h.cache.evictable_size() == 0 and h.cache.protected_size() == 0
    assert h.cache.match_prefix([1, 2, 3]).indices.numel() == 0
    assert h.cache.all_values().numel() == 0
    h.check()


# --------------------------------------------------------- request-level scenarios


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefix_reused_by_second_request(page_size: int) -> None:
    h = Harness(page_size, 32, radix=True)
    prompt = list(range(11))
    r1 = h.admit(prompt, first_chunk=100)
    assert r1 is not None
    h.check()
    h.finish(r1)
    h.check()
    r2 = h.admit(prompt + [50, 51], first_chunk=100)
    assert r2 is not None
    cached = 11 - 11 % page_size
    assert len(r2.prefix_indices) == cached
    h.check()
    h.drain()


@pytest.mark.parametrize("page_size", [1, 4])
def test_concurrent_duplicate_computation(page_size: int) -> None:
    """Two requests compute the same tokens side by side; the second to finish must free its
    copies of what the first already inserted, and nothing may leak."""
    h = Harness(page_size, 64, radix=True)
    prompt = [1, 2, 1, 2, 1, 2, 1, 2, 1]
    a = h.admit(prompt, first_chunk=100)
    b = h.admit(prompt, first_chunk=100)
    assert a is not None and b is not None
    assert len(b.prefix_indices) == 0  # a had not inserted anything yet
    h.check()
    h.finish(a)
    h.check()
    h.finish(b)
    h.check()
    aligned = len(prompt) - len(prompt) % page_size
    assert h.cache.evictable_size() == aligned
    h.drain()


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_against_duplicate(page_size: int) -> None:
    """A chunked prefill inserts its first chunk while a second request already computed the same
    tokens on its own slots: cache_unfinished_req must switch the row to the tree's slots."""
    h = Harness(page_size, 64, radix=True)
    prompt = list(range(20))
    b = h.admit(prompt, first_chunk=10)
    a = h.admit(prompt, first_chunk=6)
    assert a is not None and b is not None
    h.unfinished(b)  # b inserts 0..9 (8 with pages of 4)
    h.check()
    h.unfinished(a)  # a's 0..5 duplicates b's: a's own copies are freed, row points at b's
    h.check()
    assert h.extend(a, 9, [])
    h.unfinished(a)
    h.check()
    assert h.extend(b, 10, [])
    h.finish(b)
    h.check()
    assert h.extend(a, 100, [7] * 100)  # finish a's prompt and decode a few tokens
    h.unfinished(a)
    h.check()
    h.finish(a)
    h.drain()


@pytest.mark.parametrize("page_size", [1, 4])
def test_abort_right_after_admission(page_size: int) -> None:
    h = Harness(page_size, 32, radix=True)
    r = h.admit(list(range(9)), first_chunk=100)
    assert r is not None
    h.finish(r)
    r2 = h.admit(list(range(9)), first_chunk=0)  # admitted, nothing computed, then aborted
    assert r2 is not None and r2.kv_allocated_len == 9 - 9 % page_size
    h.check()
    h.finish(r2)
    h.drain()


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunk_cache_frees_everything(page_size: int) -> None:
    h = Harness(page_size, 32, radix=False)
    r = h.admit(list(range(10)), first_chunk=4)
    assert r is not None
    h.unfinished(r)
    h.check()
    assert h.extend(r, 6, [])
    h.check()
    h.finish(r)
    assert h.allocator.available_size() == h.allocator.total_size
    r2 = h.admit(list(range(10)), first_chunk=100)
    assert r2 is not None and len(r2.prefix_indices) == 0
    h.drain()


def test_oom_evicts_then_retracts() -> None:
    h = Harness(1, 12, radix=True)  # 11 usable slots
    r1 = h.admit([1] * 8, first_chunk=8)
    assert r1 is not None
    h.finish(r1)
    assert h.cache.evictable_size() == 8
    r2 = h.admit([2] * 6, first_chunk=6)  # needs eviction of r1's tokens
    assert r2 is not None and r2.kv_allocated_len == 6
    h.check()
    r3 = h.admit([3] * 6, first_chunk=6)  # 5 free, nothing evictable: aborted
    assert r3 is None
    h.check()
    h.drain()


# ====================================================================== state machine

VOCAB = st.integers(0, 2)  # a tiny vocabulary so that prefixes collide all the time
# Prompts are mostly a cut of one of a few shared "system prompts" plus a random tail, so that
# page-sized prefixes (not only single tokens) are shared between requests, as in real traffic.
_BASES = [[0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
          [0, 1, 2, 0, 1, 2, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0],
          [2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 2, 2]]
PROMPTS = st.builds(
    lambda base, cut, tail: (base[:cut] + tail) or [0],
    st.sampled_from(_BASES), st.integers(0, 16), st.lists(VOCAB, max_size=8),
)


class CacheMachine(RuleBasedStateMachine):
    PAGE_SIZE = 1
    NUM_PAGES = 40
    RADIX = True

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(self.PAGE_SIZE, self.NUM_PAGES, self.RADIX)

    def _pick(self, i: int) -> FakeReq:
        return self.h.running[i % len(self.h.running)]

    @precondition(lambda self: self.h.pool.available_size() > 0)
    @rule(prompt=PROMPTS, chunk=st.integers(0, 12))
    def admit(self, prompt: list[int], chunk: int) -> None:
        self.h.admit(prompt, chunk)

    @precondition(lambda self: self.h.running)
    @rule(i=st.integers(0, 7), k=st.integers(1, 8),
          new=st.lists(VOCAB, min_size=8, max_size=8))
    def extend(self, i: int, k: int, new: list[int]) -> None:
        self.h.extend(self._pick(i), k, new)

    @precondition(lambda self: self.h.running)
    @rule(i=st.integers(0, 7))
    def cache_unfinished(self, i: int) -> None:
        self.h.unfinished(self._pick(i))

    @precondition(lambda self: self.h.running)
    @rule(i=st.integers(0, 7))
    def finish(self, i: int) -> None:
        self.h.finish(self._pick(i))

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        self.h.evict(n)

    @precondition(lambda self: not self.h.running)
    @rule()
    def flush(self) -> None:
        # flush_cache: only legal with nothing running; the scheduler also clears the allocator.
        self.h.cache.reset()
        self.h.allocator.clear()

    @invariant()
    def accounting(self) -> None:
        self.h.check()

    def teardown(self) -> None:
        self.h.drain()


# Sized to keep this file around 30 s on 2 cores; raise max_examples locally when changing the
# caches (the machines have been run at 600 examples x 80 steps, page sizes 1/2/4/16, clean).
_SETTINGS = settings(max_examples=400, stateful_step_count=50, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


class RadixPage1(CacheMachine):
    PAGE_SIZE, NUM_PAGES, RADIX = 1, 40, True


class RadixPage4(CacheMachine):
    PAGE_SIZE, NUM_PAGES, RADIX = 4, 12, True


class ChunkPage1(CacheMachine):
    PAGE_SIZE, NUM_PAGES, RADIX = 1, 40, False


class ChunkPage4(CacheMachine):
    PAGE_SIZE, NUM_PAGES, RADIX = 4, 12, False


TestRadixPage1 = RadixPage1.TestCase
TestRadixPage1.settings = _SETTINGS
TestRadixPage4 = RadixPage4.TestCase
TestRadixPage4.settings = _SETTINGS
TestChunkPage1 = ChunkPage1.TestCase
TestChunkPage1.settings = settings(_SETTINGS, max_examples=100)
TestChunkPage4 = ChunkPage4.TestCase
TestChunkPage4.settings = settings(_SETTINGS, max_examples=100)


@pytest.mark.parametrize("page_size", [1, 4])
def test_peek_prefix_agrees_with_match_and_changes_nothing(page_size: int) -> None:
    import random

    rng = random.Random(page_size)
    h = make(page_size=page_size, num_pages=512)
    for _ in range(12):
        put(h, [rng.randrange(4) for _ in range(rng.randrange(1, 24))])

    def shape(node: TreeNode) -> list:
        return [(tuple(c.key), c.last_access, shape(c)) for c in node.children.values()]

    for _ in range(60):
        key = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        before = shape(h.cache.root)
        length, node = h.cache.peek_prefix(key)
        assert shape(h.cache.root) == before        # no split, no access time touched
        m = h.cache.match_prefix(key)
        assert length == m.indices.numel()
        # The peeked node holds the match's end: the matched node itself, or the node the
        # match ends inside, which match_prefix split into m.last_node and a child.
        assert node is m.last_node or node.parent is m.last_node
    assert ChunkCache(h.pool, h.allocator).peek_prefix([1, 2, 3])[0] == 0
    h.check()
