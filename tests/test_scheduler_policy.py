"""Unit tests for the scheduler's admission side: queue ordering (policy.py), prefill admission
(prefill.py) and decode-memory helpers (decode.py).

Everything runs on real objects on the CPU: a KVAllocator / ReqToTokenPool / RadixCache with a
few hundred slots and Req objects; no model. Expectations are derived from the documented rules
(module docstrings, docs/architecture.md "One scheduler step") with independent oracles where
possible (longest common prefix computed by hand, pages counted by the allocator), not copied
from the implementation.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.pools import ReqToTokenPool
from radixlm.mem_cache.radix_cache import RadixCache
from radixlm.scheduler.decode import NewTokenRatio, decode_tokens_needed, pick_retraction_victim
from radixlm.scheduler.policy import SchedulePolicy
from radixlm.scheduler.prefill import AddResult, PrefillAdder
from radixlm.scheduler.request import Req
from radixlm.sampling.params import SamplingParams

# Documented numbers (docs/architecture.md, "One scheduler step").
FALLBACK_QUEUE_LEN = 128      # lpm and dfs-weight fall back to fcfs past 128 waiting
SHARED_HEAD = 32              # in-batch prefix sharing looks at the first 32 tokens


# ====================================================================== helpers


def toks(base: int, n: int) -> list[int]:
    """n distinct token ids starting at base (families use far-apart bases)."""
    return list(range(base, base + n))


def make_req(prompt: list[int], arrival: int, max_new_tokens: int = 16,
             output: list[int] | None = None) -> Req:
    return Req(rid=f"r{arrival}", origin_input_ids=list(prompt),
               sampling_params=SamplingParams(max_new_tokens=max_new_tokens), seed=0,
               arrival=arrival, output_ids=list(output or []))


class Mem:
    """The memory side of a scheduler: allocator, request-slot pool and radix cache."""

    def __init__(self, usable_pages: int = 256, page_size: int = 1, max_reqs: int = 16):
        # +1 page: page 0 is the allocator's padding page.
        self.alloc = KVAllocator((usable_pages + 1) * page_size, page_size, "cpu")
        self.pool = ReqToTokenPool(max_reqs, 1024, "cpu")
        self.cache = RadixCache(self.pool, self.alloc)
        self.page_size = page_size
        self.inserted: list[list[int]] = []

    def cache_tokens(self, tokens: list[int]) -> torch.Tensor:
        """Put tokens into the tree as a finished request would (evictable afterwards)."""
        slots = self.alloc.alloc(len(tokens))
        assert slots is not None
        already = self.cache.insert(tokens, slots)
        if already:
            self.alloc.free(slots[:already])
        self.inserted.append(list(tokens))
        return slots

    def hold(self, n: int) -> torch.Tensor:
        """KV owned by some running request (neither free nor in the tree)."""
        slots = self.alloc.alloc(n)
        assert slots is not None
        return slots

    def budget_pool(self) -> int:
        return self.alloc.available_size() + self.cache.evictable_size()

    def adder(self, running=(), ratio: float = 0.0, max_prefill_tokens: int = 1 << 20,
              chunk: int | None = None, slots: int = 16, share: bool = True) -> PrefillAdder:
        return PrefillAdder(self.cache, self.alloc, list(running), ratio, max_prefill_tokens,
                            chunk, slots, share_prefixes=share)

    def oracle_cached_len(self, req: Req) -> int:
        """Longest prefix of what the request may take from the cache that some inserted
        sequence shares (page aligned); computed without the tree."""
        key = req.fill_ids[:req.seq_len - 1]  # at least one token is computed for logits
        best = 0
        for seq in self.inserted:
            n = 0
            while n < min(len(key), len(seq)) and key[n] == seq[n]:
                n += 1
            best = max(best, n)
        return best - best % self.page_size


def tree_snapshot(cache: RadixCache) -> dict:
    """Structure of the tree: token path of every node -> (key length, number of children)."""
    out, stack = {}, [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        out[path] = (len(node.key), len(node.children))
        for child in node.children.values():
            stack.append((child, path + tuple(child.key)))
    return out


def lru_snapshot(cache: RadixCache) -> dict[int, int]:
    out, stack = {}, [cache.root]
    while stack:
        node = stack.pop()
        out[id(node)] = node.last_access
        stack.extend(node.children.values())
    return out


def run_admission(adder: PrefillAdder, queue: list[Req]) -> dict[str, AddResult]:
    """Drive the adder exactly like Admission.prefill_batch: stop at NO_ROOM or CHUNKED, skip
    DEFERRED."""
    results = {}
    for req in queue:
        res = adder.add(req)
        results[req.rid] = res
        if res in (AddResult.NO_ROOM, AddResult.CHUNKED):
            break
    return results


def allocate_admitted(mem: Mem, adder: PrefillAdder) -> None:
    """What ScheduleBatch.prepare_extend does with the admitted requests: slots for each
    extend, evicting unlocked cache when the allocator runs dry. Fails if it cannot."""
    for req in adder.added:
        n = req.extend_input_len
        locs = mem.alloc.alloc(n)  # prefixes are page aligned, so the extend starts a new page
        if locs is None:
            short = mem.alloc.pages_needed(0, n) * mem.page_size - mem.alloc.available_size()
            mem.cache.evict(short)
            locs = mem.alloc.alloc(n)
        assert locs is not None, (
            f"admitted batch does not fit: {req.rid} needs {n} tokens, "
            f"{mem.alloc.available_size()} free + {mem.cache.evictable_size()} evictable")


# ====================================================================== policies


def test_fcfs_orders_by_arrival_not_by_list_position() -> None:
    mem = Mem()
    mem.cache_tokens(toks(1000, 40))
    arrivals = [5, 2, 7, 0, 3, 6, 1, 4]
    # Give the late arrivals the long cache hits and long outputs, so only arrival explains fcfs.
    waiting = [make_req(toks(1000, 40) + [a] if a > 4 else toks(5000 + 100 * a, 10), a,
                        max_new_tokens=100 - a) for a in arrivals]
    out = SchedulePolicy("fcfs", mem.cache).order(waiting)
    assert [r.arrival for r in out] == sorted(arrivals)
    assert [r.arrival for r in waiting] == arrivals  # the queue itself is not reordered


def test_lpm_orders_by_longest_cached_prefix() -> None:
    mem = Mem()
    p1, p2, p3 = toks(1000, 60), toks(2000, 20), toks(3000, 40)
    for p in (p1, p2, p3):
        mem.cache_tokens(p)
    waiting = [
        make_req(p2 + toks(9000, 5), arrival=0),          # 20 cached
        make_req(toks(8000, 30), arrival=1),              # nothing cached
        make_req(p1[:30] + toks(9100, 10), arrival=2),    # 30 cached, ends inside a node
        make_req(p1 + toks(9200, 3), arrival=3),          # 60 cached
        make_req(p3 + [7], arrival=4),                    # 40 cached
        make_req(p2 + toks(9300, 7), arrival=5),          # 20 cached, ties with arrival 0
        make_req(p3, arrival=6),                          # 39: the last token is computed
    ]
    random.Random(1).shuffle(waiting)
    expected = sorted(waiting, key=lambda r: (-mem.oracle_cached_len(r), r.arrival))
    assert [mem.oracle_cached_len(r) for r in expected] == [60, 40, 39, 30, 20, 20, 0]
    out = SchedulePolicy("lpm", mem.cache).order(waiting)
    assert [r.rid for r in out] == [r.rid for r in expected]


def _dfs_tree(heavy_first_inserted: bool):
    """Tree: root -> S (20 tokens) -> {X1, X2} (10 each), root -> T (20 tokens).
    Returns (mem, S+X1, S+X2, T) with the siblings inserted in the given order, so that neither
    insertion order nor its reverse can explain the expected result for both variants."""
    mem = Mem()
    s, x1, x2, t = toks(1000, 20), toks(2000, 10), toks(3000, 10), toks(4000, 20)
    order = [s + x1, s + x2, t] if heavy_first_inserted else [t, s + x2, s + x1]
    for seq in order:
        mem.cache_tokens(seq)
    return mem, s + x1, s + x2, t


@pytest.mark.parametrize("heavy_first_inserted", [True, False])
def test_dfs_weight_visits_heavier_subtrees_first_and_keeps_groups_together(
        heavy_first_inserted: bool) -> None:
    mem, sx1, sx2, t = _dfs_tree(heavy_first_inserted)
    # Waiting: 4 under S/X1, 2 under S/X2 (so S weighs 6), 2 under T, plus one cold request.
    # Arrivals interleave the groups.
    under = {"T": t, "X1": sx1, "X2": sx2}
    plan = ["T", "X2", "X1", "T", "X1", "X1", "X2", "X1"]
    waiting = [make_req(under[g] + toks(10_000 + 100 * i, 4), arrival=i)
               for i, g in enumerate(plan)]
    cold = make_req(toks(20_000, 8), arrival=len(plan))
    group = {r.rid: g for r, g in zip(waiting, plan)}
    shuffled = waiting + [cold]
    random.Random(3).shuffle(shuffled)          # the list order must not matter, only arrival
    out = SchedulePolicy("dfs-weight", mem.cache).order(shuffled)

    assert sorted(r.rid for r in out) == sorted(r.rid for r in waiting + [cold])
    warm = [r for r in out if r is not cold]
    # Documented rule: depth-first, heavier subtree first. S (6 waiting) before T (2); inside S,
    # X1 (4) before X2 (2). Inside one node, arrival order (fcfs tie-break).
    assert [group[r.rid] for r in warm] == ["X1"] * 4 + ["X2"] * 2 + ["T"] * 2
    for g in ("X1", "X2", "T"):
        arr = [r.arrival for r in warm if group[r.rid] == g]
        assert arr == sorted(arr)
    # And this is not what lpm would do (X2's first request has the same 30-token hit as X1's).
    lpm = SchedulePolicy("lpm", mem.cache).order(waiting)
    assert [group[r.rid] for r in lpm] != [group[r.rid] for r in warm]


def test_lof_orders_by_max_new_tokens_then_arrival() -> None:
    mem = Mem()
    spec = [(0, 10), (1, 500), (2, 64), (3, 500), (4, 1), (5, 64), (6, 2048)]  # (arrival, max_new)
    waiting = [make_req(toks(100 * a, 5), arrival=a, max_new_tokens=m) for a, m in spec]
    random.Random(2).shuffle(waiting)
    out = SchedulePolicy("lof", mem.cache).order(waiting)
    assert [(r.arrival, r.max_new_tokens) for r in out] == [
        (6, 2048), (1, 500), (3, 500), (2, 64), (5, 64), (0, 10), (4, 1)]


def test_random_is_a_seeded_permutation() -> None:
    mem = Mem()
    waiting = [make_req(toks(100 * i, 3), arrival=i) for i in range(20)]
    a = SchedulePolicy("random", mem.cache, seed=7).order(waiting)
    b = SchedulePolicy("random", mem.cache, seed=7).order(waiting)
    c = SchedulePolicy("random", mem.cache, seed=8).order(waiting)
    assert sorted(r.arrival for r in a) == list(range(20))
    assert [r.rid for r in a] == [r.rid for r in b]
    assert [r.rid for r in a] != [r.rid for r in c]            # 1 / 20! chance of equality
    assert [r.rid for r in a] != [r.rid for r in waiting]      # it does shuffle
    assert [r.arrival for r in waiting] == list(range(20))     # the input is left alone


def _queue_with_cache_hits(mem: Mem, n: int) -> list[Req]:
    """n waiting requests: arrival 0 hits a short cached prefix, arrivals 1 and 2 a long one,
    the rest nothing. Both prefix policies put 1 and 2 before 0 (longer hit / heavier
    subtree); fcfs keeps 0, 1, 2."""
    short, long = toks(40_000, 10), toks(50_000, 50)
    mem.cache_tokens(short)
    mem.cache_tokens(long)
    waiting = [make_req(short + [1, 2], arrival=0), make_req(long + [3], arrival=1),
               make_req(long + [4], arrival=2)]
    waiting += [make_req(toks(100 * i, 3), arrival=i) for i in range(3, n)]
    return waiting


def _warm_order(out: list[Req]) -> list[int]:
    return [r.arrival for r in out if r.arrival < 3]


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_prefix_policies_fall_back_to_fcfs_past_128_waiting(name: str) -> None:
    mem = Mem()
    at_limit = _queue_with_cache_hits(mem, FALLBACK_QUEUE_LEN)
    out = SchedulePolicy(name, mem.cache).order(at_limit)
    assert _warm_order(out) == [1, 2, 0], "at 128 waiting the prefix policy still applies"

    mem = Mem()
    past = _queue_with_cache_hits(mem, FALLBACK_QUEUE_LEN + 1)
    before = tree_snapshot(mem.cache), lru_snapshot(mem.cache)
    out = SchedulePolicy(name, mem.cache).order(list(reversed(past)))
    assert [r.arrival for r in out] == list(range(FALLBACK_QUEUE_LEN + 1))
    # The fallback exists to skip the tree lookups: the cache is not touched at all.
    assert (tree_snapshot(mem.cache), lru_snapshot(mem.cache)) == before


@pytest.mark.parametrize("name", ["fcfs", "lof", "random"])
def test_prefix_blind_policies_leave_the_cache_alone(name: str) -> None:
    mem = Mem()
    mem.cache_tokens(toks(1000, 40))
    waiting = [make_req(toks(1000, 20) + [1], arrival=0), make_req(toks(1000, 40) + [2], arrival=1)]
    before = tree_snapshot(mem.cache), lru_snapshot(mem.cache)
    SchedulePolicy(name, mem.cache).order(waiting)
    assert (tree_snapshot(mem.cache), lru_snapshot(mem.cache)) == before


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_sorting_does_not_split_tree_nodes(name: str) -> None:
    mem = Mem()
    mem.cache_tokens(toks(1000, 40))
    before = tree_snapshot(mem.cache)
    # Matches 20 of the node's 40 tokens: a lookup that splits would leave two nodes.
    waiting = [make_req(toks(1000, 20) + toks(7000, 5), arrival=0),
               make_req(toks(8000, 5), arrival=1)]
    SchedulePolicy(name, mem.cache).order(waiting)
    assert tree_snapshot(mem.cache) == before


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_sorting_does_not_change_which_prefix_is_evicted_first(name: str) -> None:
    mem = Mem()
    old, new = toks(1000, 30), toks(2000, 30)
    mem.cache_tokens(old)  # least recently used
    mem.cache_tokens(new)
    # A request that waits (it is only sorted, never admitted) and hits the old prefix.
    SchedulePolicy(name, mem.cache).order([make_req(old + [1], arrival=0),
                                          make_req(toks(9000, 4), arrival=1)])
    mem.cache.evict(30)
    assert mem.cache.match_prefix(new).indices.numel() == 30, "the LRU prefix should go first"
    assert mem.cache.match_prefix(old).indices.numel() == 0


# ====================================================================== admission


def test_admits_while_the_kv_budget_allows_then_no_room() -> None:
    mem = Mem(usable_pages=256)
    # Each request costs 60 prompt tokens + 0.5 x 10 reserved output = 65; 3 x 65 = 195 fits
    # the 256-token pool with a page to spare, a fourth (260) does not.
    queue = [make_req(toks(1000 * (i + 1), 60), arrival=i, max_new_tokens=10) for i in range(6)]
    adder = mem.adder(ratio=0.5)
    results = run_admission(adder, queue)
    assert list(results.values()) == [AddResult.ADDED] * 3 + [AddResult.NO_ROOM]
    assert [r.extend_input_len for r in adder.added] == [60, 60, 60]
    allocate_admitted(mem, adder)


def test_evictable_cache_counts_as_budget() -> None:
    mem = Mem(usable_pages=256)
    for i in range(4):                       # 200 of 256 slots hold unlocked cache
        mem.cache_tokens(toks(100_000 + 1000 * i, 50))
    assert mem.alloc.available_size() == 56
    queue = [make_req(toks(1000 * (i + 1), 60), arrival=i, max_new_tokens=10) for i in range(6)]
    adder = mem.adder(ratio=0.5)
    # Same numbers as above: free + evictable is still 256, so three requests fit.
    assert list(run_admission(adder, queue).values()) == [AddResult.ADDED] * 3 + [AddResult.NO_ROOM]
    allocate_admitted(mem, adder)            # by evicting the cache


def test_running_requests_reserve_ratio_times_their_remaining_output() -> None:
    # 256-slot pool; one running request promised 200 new tokens.
    def admit(ratio: float, decoded: int) -> AddResult:
        mem = Mem(usable_pages=256)
        running = make_req(toks(1, 4), arrival=0, max_new_tokens=200, output=list(range(decoded)))
        waiting = make_req(toks(1000, 100), arrival=1, max_new_tokens=1)
        return mem.adder(running=[running], ratio=ratio).add(waiting)

    # ratio 1, nothing decoded: 200 reserved, 56 left < 100-token prompt.
    assert admit(ratio=1.0, decoded=0) is AddResult.NO_ROOM
    # Only the *remaining* output is reserved: 100 decoded -> 100 reserved, 156 left.
    assert admit(ratio=1.0, decoded=100) is AddResult.ADDED
    # The ratio scales the reservation: 0.5 x 200 = 100 reserved, 156 left.
    assert admit(ratio=0.5, decoded=0) is AddResult.ADDED
    # ratio 0.9 x 200 = 180 reserved, 76 left.
    assert admit(ratio=0.9, decoded=0) is AddResult.NO_ROOM


def test_huge_max_new_tokens_reserve_is_clipped() -> None:
    """prefill.py: a request promising 100k new tokens should not block admission as if it
    will use them all."""
    mem = Mem(usable_pages=8192)
    running = make_req(toks(1, 4), arrival=0, max_new_tokens=100_000)
    waiting = make_req(toks(1000, 100), arrival=1, max_new_tokens=1)
    assert mem.adder(running=[running], ratio=1.0).add(waiting) is AddResult.ADDED


def test_admitted_requests_reserve_for_their_own_outputs() -> None:
    mem = Mem(usable_pages=256)
    running = [make_req(toks(1, 4), arrival=0, max_new_tokens=0)]  # something runs; reserves 0
    # 50-token prompts promising 100 tokens each: with ratio 1 each costs 150 -> one fits.
    queue = [make_req(toks(1000 * (i + 1), 50), arrival=i + 1, max_new_tokens=100)
             for i in range(3)]
    assert list(run_admission(mem.adder(running, ratio=1.0), queue).values()) == [
        AddResult.ADDED, AddResult.NO_ROOM]
    # With ratio 0 only prompts count: 3 x 50 fit.
    assert list(run_admission(mem.adder(running, ratio=0.0), queue).values()) == [
        AddResult.ADDED] * 3


def test_lone_request_is_admitted_even_if_its_reservation_does_not_fit() -> None:
    """With nothing running and nothing admitted yet, refusing would stall the server forever;
    the prompt itself must still fit."""
    mem = Mem(usable_pages=256)
    big_output = make_req(toks(1000, 200), arrival=0, max_new_tokens=4000)
    assert mem.adder(ratio=1.0).add(big_output) is AddResult.ADDED
    too_long = make_req(toks(1000, 300), arrival=0, max_new_tokens=1)
    assert Mem(usable_pages=256).adder(ratio=1.0).add(too_long) is AddResult.NO_ROOM
    # ...but only when nothing runs: a running request keeps its claim on the memory.
    mem = Mem(usable_pages=256)
    running = make_req(toks(1, 4), arrival=1, max_new_tokens=0)
    assert mem.adder([running], ratio=1.0).add(
        make_req(toks(1000, 200), arrival=2, max_new_tokens=4000)) is AddResult.NO_ROOM


def test_max_prefill_tokens_stops_admission() -> None:
    mem = Mem(usable_pages=1024)
    queue = [make_req(toks(1000 * (i + 1), 40), arrival=i) for i in range(4)]
    adder = mem.adder(max_prefill_tokens=100)
    assert list(run_admission(adder, queue).values()) == [
        AddResult.ADDED, AddResult.ADDED, AddResult.NO_ROOM]          # 40 + 40, then 40 > 20
    assert sum(r.extend_input_len for r in adder.added) <= 100
    # A first request larger than the limit still runs (otherwise it never would).
    big = make_req(toks(1000, 150), arrival=0)
    assert Mem(usable_pages=1024).adder(max_prefill_tokens=100).add(big) is AddResult.ADDED


def test_request_slot_limit_stops_admission() -> None:
    mem = Mem(usable_pages=1024)
    queue = [make_req(toks(1000 * (i + 1), 10), arrival=i) for i in range(5)]
    adder = mem.adder(slots=2)
    assert list(run_admission(adder, queue).values()) == [
        AddResult.ADDED, AddResult.ADDED, AddResult.NO_ROOM]
    assert Mem().adder(slots=0).add(make_req([1, 2, 3], arrival=0)) is AddResult.NO_ROOM


def test_last_request_is_chunked_at_the_chunk_size() -> None:
    mem = Mem(usable_pages=1024)
    queue = [make_req(toks(1000 * (i + 1), 40), arrival=i) for i in range(3)]
    adder = mem.adder(chunk=64)
    assert list(run_admission(adder, queue).values()) == [AddResult.ADDED, AddResult.CHUNKED]
    # The chunk takes what is left of the 64-token step budget.
    assert [r.extend_input_len for r in adder.added] == [40, 24]


def test_chunked_request_continues_chunk_by_chunk() -> None:
    mem = Mem(usable_pages=1024)
    req = make_req(toks(1000, 150), arrival=0)
    first = mem.adder(chunk=64)
    assert first.add(req) is AddResult.CHUNKED and req.extend_input_len == 64
    computed = [64]
    while True:
        req.kv_allocated_len = sum(computed)   # what launching the chunk does
        res = mem.adder(chunk=64).add_chunked(req)
        computed.append(req.extend_input_len)
        if res is AddResult.ADDED:
            break
        assert res is AddResult.CHUNKED
    assert computed == [64, 64, 22]


def test_chunks_are_page_aligned() -> None:
    mem = Mem(usable_pages=64, page_size=16)
    req = make_req(toks(1000, 150), arrival=0)
    assert mem.adder(chunk=40).add(req) is AddResult.CHUNKED
    # At most the chunk size, and whole pages so the next chunk starts on a page boundary.
    assert req.extend_input_len == 32


def test_admission_locks_cached_prefixes() -> None:
    mem = Mem(usable_pages=256)
    prefix = toks(1000, 40)
    slots = mem.cache_tokens(prefix)
    assert (mem.cache.protected_size(), mem.cache.evictable_size()) == (0, 40)
    req = make_req(prefix + toks(9000, 20), arrival=0)
    assert mem.adder().add(req) is AddResult.ADDED
    assert mem.cache.protected_size() == 40 and mem.cache.evictable_size() == 0
    assert torch.equal(req.prefix_indices, slots)
    assert req.extend_input_len == 20 and req.cached_tokens == 40
    # Locked means eviction cannot take it while the request runs.
    assert mem.cache.evict(1000) == 0


def test_locked_prefix_no_longer_counts_as_evictable_budget() -> None:
    mem = Mem(usable_pages=256)
    prefix = toks(1000, 200)
    mem.cache_tokens(prefix)                       # 56 free + 200 evictable
    a = make_req(prefix + toks(9000, 30), arrival=0, max_new_tokens=1)
    b = make_req(toks(20_000, 40), arrival=1, max_new_tokens=1)
    adder = mem.adder()
    assert adder.add(a) is AddResult.ADDED
    # a locked 200 tokens and will compute 30 (+1 reserved): 25 remain, b's 40 do not fit.
    assert adder.add(b) is AddResult.NO_ROOM
    allocate_admitted(mem, adder)


def test_shared_uncached_head_is_deferred() -> None:
    mem = Mem(usable_pages=1024)
    head = toks(1000, SHARED_HEAD)
    a = make_req(head + toks(2000, 10), arrival=0)
    b = make_req(head + toks(3000, 10), arrival=1)
    c = make_req(toks(4000, 50), arrival=2)
    adder = mem.adder(slots=2)
    assert run_admission(adder, [a, b, c]) == {
        "r0": AddResult.ADDED, "r1": AddResult.DEFERRED, "r2": AddResult.ADDED}
    # The deferred request took no request slot (c got the second one) and locked nothing.
    assert adder.added == [a, c]
    assert b.extend_input_len == 0 and b.last_node is None


def test_heads_differing_within_first_32_tokens_are_not_deferred() -> None:
    mem = Mem(usable_pages=1024)
    a = make_req(toks(1000, 50), arrival=0)
    b = make_req(toks(1000, SHARED_HEAD - 1) + toks(5000, 19), arrival=1)
    adder = mem.adder()
    assert [adder.add(a), adder.add(b)] == [AddResult.ADDED, AddResult.ADDED]


def test_short_identical_prompts_are_not_deferred() -> None:
    mem = Mem(usable_pages=1024)
    adder = mem.adder()
    same = toks(1000, SHARED_HEAD - 2)
    assert [adder.add(make_req(same, 0)), adder.add(make_req(same, 1))] == [AddResult.ADDED] * 2


@pytest.mark.parametrize("cached,expected", [(0, AddResult.DEFERRED),
                                             (SHARED_HEAD - 1, AddResult.DEFERRED),
                                             (SHARED_HEAD, AddResult.ADDED),
                                             (SHARED_HEAD + 8, AddResult.ADDED)])
def test_deferral_only_when_cache_has_less_than_the_shared_head(cached, expected) -> None:
    mem = Mem(usable_pages=1024)
    shared = toks(1000, 60)
    if cached:
        mem.cache_tokens(shared[:cached])
    a = make_req(shared + toks(2000, 5), arrival=0)
    b = make_req(shared + toks(3000, 5), arrival=1)
    adder = mem.adder()
    assert adder.add(a) is AddResult.ADDED
    assert adder.add(b) is expected


def test_no_deferral_without_prefix_sharing() -> None:
    """--disable-radix-cache turns sharing off: waiting would not help anyone."""
    mem = Mem(usable_pages=1024)
    head = toks(1000, SHARED_HEAD)
    adder = mem.adder(share=False)
    assert [adder.add(make_req(head + [1], 0)), adder.add(make_req(head + [2], 1))] == [
        AddResult.ADDED] * 2


def _random_admission_round(rng: random.Random, queue_reuses_cache: bool) -> None:
    cached_families = [toks(100_000 * (f + 1), 80) for f in range(4)]
    queue_families = cached_families if queue_reuses_cache else [
        toks(5_000_000 + 100_000 * f, 80) for f in range(3)]
    mem = Mem(usable_pages=rng.randint(64, 320))
    for _ in range(rng.randint(0, 4)):
        seq = rng.choice(cached_families)[:rng.randint(5, 60)]
        if mem.alloc.available_size() > len(seq) + 8:
            mem.cache_tokens(seq)
    ratio = rng.choice([0.0, 0.1, 0.4, 0.7, 1.0])
    running = []
    for i in range(rng.randint(1, 3)):
        n = rng.randint(1, 40)
        if mem.alloc.available_size() <= n:
            break
        mem.hold(n)
        running.append(make_req(toks(900_000 + 100 * i, n), arrival=-1 - i,
                                max_new_tokens=rng.randint(0, 100)))
    queue = []
    for i in range(rng.randint(1, 8)):
        prompt = (rng.choice(queue_families)[:rng.randint(0, 70)]
                  + toks(1_000_000 + 1000 * i, rng.randint(1, 40)))
        queue.append(make_req(prompt, arrival=i, max_new_tokens=rng.randint(1, 64)))
    adder = mem.adder(running, ratio=ratio, chunk=rng.choice([None, 32, 64]),
                      max_prefill_tokens=rng.choice([64, 4096]))
    run_admission(adder, SchedulePolicy("lpm", mem.cache).order(queue))
    allocate_admitted(mem, adder)
    if running and adder.added:
        # The budget promised to keep room for every reservation (running and admitted). (With
        # nothing admitted the running requests may already be over: that is retraction's job.)
        promised = sum(int(min(r.remaining_new_tokens, 4096) * ratio)
                       for r in running + adder.added)
        assert mem.budget_pool() >= promised, "admission ate into reserved memory"


@pytest.mark.parametrize("queue_reuses_cache", [False, True])
def test_admitted_batch_always_fits_and_keeps_reservations(queue_reuses_cache: bool) -> None:
    """Randomised (page size 1, fixed seed): whatever admission lets in can be allocated
    (evicting unlocked cache), and afterwards free + evictable still covers every reservation
    it promised. Without cache reuse the waiting requests still share uncached heads (DEFERRED)
    and compete with evictable cache, chunking, and max-prefill limits."""
    rng = random.Random(1234)
    for _ in range(150):
        _random_admission_round(rng, queue_reuses_cache)


def test_locking_a_large_cached_prefix_still_leaves_room_for_the_new_tokens() -> None:
    mem = Mem(usable_pages=256)
    mem.hold(46)                                   # a running request's KV
    prefix = toks(1000, 200)
    mem.cache_tokens(prefix)                       # 10 free + 200 evictable
    running = [make_req(toks(1, 4), arrival=0, max_new_tokens=0)]
    # 50 new tokens on top of the 200 cached: once the prefix is locked only 10 slots are
    # left, so this must wait (NO_ROOM) rather than be admitted.
    req = make_req(prefix + toks(9000, 50), arrival=1, max_new_tokens=1)
    adder = mem.adder(running)
    evictable = mem.cache.evictable_size()
    assert adder.add(req) is AddResult.NO_ROOM
    # The lock taken to check it is released again: the prefix stays evictable.
    assert mem.cache.protected_size() == 0 and mem.cache.evictable_size() == evictable
    assert adder.added == []


def test_admitted_batch_fits_with_page_size_16() -> None:
    mem = Mem(usable_pages=4, page_size=16)            # 64 slots = 4 pages
    queue = [make_req([100 * i + 1, 100 * i + 2], arrival=i, max_new_tokens=1) for i in range(8)]
    adder = mem.adder(ratio=0.7)
    run_admission(adder, queue)
    # Every 2-token request starts a fresh page, so at most 4 of them can be in the batch.
    assert len(adder.added) <= 4
    allocate_admitted(mem, adder)


# ====================================================================== decode and retraction


def test_retraction_victim_has_fewest_output_tokens() -> None:
    reqs = [make_req(toks(0, 10), 0, output=[1] * 5),
            make_req(toks(0, 500), 1, output=[1] * 3),   # longest prompt, but more output
            make_req(toks(0, 20), 2, output=[1] * 2),
            make_req(toks(0, 30), 3, output=[1] * 9)]
    assert pick_retraction_victim(reqs) is reqs[2]


def test_retraction_tie_goes_to_the_longest_prompt_regardless_of_order() -> None:
    reqs = [make_req(toks(0, 10), 0, output=[1] * 4),
            make_req(toks(0, 90), 1, output=[1] * 4),
            make_req(toks(0, 40), 2, output=[1] * 4),
            make_req(toks(0, 900), 3, output=[1] * 5)]
    for seed in range(5):
        shuffled = list(reqs)
        random.Random(seed).shuffle(shuffled)
        assert pick_retraction_victim(shuffled) is reqs[1]
    # Full ties are broken deterministically too: the same victim whatever the list order.
    twins = [make_req(toks(0, 10), a, output=[1]) for a in range(4)]
    victims = {pick_retraction_victim(random.Random(s).sample(twins, 4)).rid for s in range(8)}
    assert len(victims) == 1


def test_decode_tokens_needed_page_size_1_is_one_per_request() -> None:
    reqs = [make_req(toks(0, n), i) for i, n in enumerate([1, 7, 16, 33])]
    for r in reqs:
        r.kv_allocated_len = r.seq_len
        r.num_pending = 1   # the overlap state: its last token is on the device
    assert decode_tokens_needed(reqs, 1) == 4
    assert decode_tokens_needed([], 1) == 0


def test_decode_tokens_needed_page_size_16_counts_new_pages() -> None:
    page = 16
    kv_lens = [1, 15, 16, 17, 31, 32, 33, 48, 100]
    reqs = []
    for i, kv in enumerate(kv_lens):
        r = make_req(toks(0, kv), i)
        r.kv_allocated_len = kv
        r.num_pending = 1
        reqs.append(r)
    # Oracle: let the allocator grow each request by one token and count the pages it takes.
    alloc = KVAllocator(64 * page, page, "cpu")
    taken = 0
    for kv in kv_lens:
        slots = alloc.alloc(kv)
        before = alloc.available_size()
        assert alloc.alloc_extend(kv, int(slots[-1]), 1) is not None
        taken += before - alloc.available_size()
    assert taken == 3 * page  # kv 16, 32 and 48 start a page (sanity of the oracle)
    assert decode_tokens_needed(reqs, page) == taken


def test_decode_tokens_needed_page_size_16_hand_cases() -> None:
    def need(kv: int) -> int:
        r = make_req(toks(0, kv), 0)
        r.kv_allocated_len = kv
        r.num_pending = 1
        return decode_tokens_needed([r], 16)
    # Token position kv goes to page kv // 16: new page exactly when kv is a multiple of 16.
    assert [need(kv) for kv in (1, 15, 16, 17, 32, 47, 48)] == [0, 0, 16, 0, 16, 0, 16]


def test_decode_tokens_needed_counts_jumped_tokens() -> None:
    # After a jump-forward a request computes every forced token whose KV is missing.
    r = make_req(toks(0, 20), 0, output=[1, 2, 3, 4, 5])
    r.kv_allocated_len = 21          # 4 output tokens (and the prompt) keep their KV
    assert r.num_decode_tokens == 4
    assert decode_tokens_needed([r], 1) == 4
    # Positions 21..24 with page 16: none starts a page; 31..34 cross into page 2 (position 32).
    assert decode_tokens_needed([r], 16) == 0
    r.kv_allocated_len, r.output_ids = 31, list(range(15))
    assert r.num_decode_tokens == 4 and decode_tokens_needed([r], 16) == 16


def test_new_token_ratio_decays_to_its_floor_and_stays() -> None:
    r = NewTokenRatio.create(1.0)
    assert 0 < r.min < r.init <= 1.0 and r.value == r.init
    values = [r.value]
    for _ in range(2000):
        r.step()
        values.append(r.value)
    assert all(b <= a for a, b in zip(values, values[1:]))
    first_floor = values.index(r.min)
    assert 0 < first_floor < 2000
    assert all(a > b for a, b in zip(values[:first_floor], values[1:first_floor + 1]))
    assert all(v == r.min for v in values[first_floor:])


def test_new_token_ratio_scales_with_conservativeness_and_caps_at_1() -> None:
    low, mid, high = (NewTokenRatio.create(c) for c in (0.5, 1.0, 100.0))
    assert low.init < mid.init <= high.init == 1.0
    assert low.min < mid.min
    assert high.min <= high.init


def test_new_token_ratio_jumps_back_up_after_retraction() -> None:
    r = NewTokenRatio.create(1.0)
    for _ in range(2000):
        r.step()
    floor = r.value
    # Survivors that already used 90% of their promised tokens will likely need at least that.
    survivors = [make_req([1], i, max_new_tokens=100, output=[1] * 90) for i in range(3)]
    r.after_retraction(survivors)
    assert 0.9 <= r.value <= 1.0 and r.value > floor
    # It decays again afterwards.
    before = r.value
    r.step()
    assert r.value < before
    # Survivors near the end cap the ratio at 1, never above.
    r.after_retraction([make_req([1], 0, max_new_tokens=10, output=[1] * 10)])
    assert r.value == 1.0


def test_retraction_never_lowers_the_ratio() -> None:
    r = NewTokenRatio.create(1.0)
    start = r.value
    # Survivors that decoded nothing out of huge budgets suggest a tiny ratio: keep the current.
    r.after_retraction([make_req([1], i, max_new_tokens=100_000) for i in range(2)])
    assert r.value == start
    r.after_retraction([])            # nobody survived: nothing to learn, no crash
    assert r.value == start
