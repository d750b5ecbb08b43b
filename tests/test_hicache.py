"""The hierarchical radix cache (host tier under the radix tree), on the CPU: the tree and the
copies alone (every cached prefix's KV is what was written for its tokens, whatever moved
between the tiers; accounting holds on both tiers; locked nodes are never lost), and the engine
with and without it (same tokens; prefixes evicted from the device come back from the host)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixlm.mem_cache.allocator import KVAllocator
from radixlm.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixlm.mem_cache.pools import KVPool, ReqToTokenPool

LAYERS, HEADS, DIM = 2, 1, 2


def make_cache(device_slots: int, ratio: float, policy: str, page_size: int = 1):
    pool = KVPool(device_slots, LAYERS, HEADS, DIM, torch.float32, "cpu")
    alloc = KVAllocator(device_slots, page_size, "cpu")
    cache = HiRadixCache(ReqToTokenPool(4, 64, "cpu"), alloc, pool,
                         HiCacheConfig(ratio=ratio, write_policy=policy))
    return cache, pool, alloc


def cache_tokens(cache, pool, alloc, tokens: list[int]) -> bool:
    """What a finished request does: its KV (K = token id, V = -token id in every layer) goes
    into the tree; the slots the tree already had on the device are freed as duplicates, and
    so is a partial last page."""
    slots = alloc.alloc(len(tokens))
    if slots is None:
        cache.evict(len(tokens) - alloc.available_size())
        slots = alloc.alloc(len(tokens))
        if slots is None:
            return False
    t = torch.tensor(tokens, dtype=torch.float32)[:, None, None].expand(-1, HEADS, DIM)
    for layer in range(LAYERS):
        pool.set_kv(layer, slots, t, -t)
    already = cache.insert(tokens, slots)
    alloc.free(slots[:already])
    aligned = len(tokens) - len(tokens) % alloc.page_size   # the tree keeps whole pages
    alloc.free(slots[aligned:])
    return True


def check_content(pool, indices: torch.Tensor, tokens: list[int]) -> None:
    want = torch.tensor(tokens[:len(indices)], dtype=torch.float32)
    for layer in range(LAYERS):
        k, v = pool.get_kv(layer)
        assert torch.equal(k[indices, 0, 0], want) and torch.equal(v[indices, 0, 1], -want)


def check_accounting(cache, alloc) -> None:
    assert (alloc.available_size() + cache.evictable_size() + cache.protected_size()
            == alloc.total_size)
    assert int(cache.all_values().numel()) == cache.evictable_size() + cache.protected_size()
    cache.check_host_invariant()


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_prefix_evicted_to_host_comes_back_with_its_kv(policy):
    cache, pool, alloc = make_cache(device_slots=48, ratio=4.0, policy=policy)
    a = list(range(100, 130))
    b = list(range(200, 230))
    assert cache_tokens(cache, pool, alloc, a)
    if policy == "write_through_selective":
        cache.match_prefix(a)            # the second hit is what backs it up
        cache.match_prefix(a)
    assert cache_tokens(cache, pool, alloc, b)   # 60 tokens > 47 slots: a is evicted
    assert cache.peek_prefix(a)[0] == 30          # still in the tree (on the host)
    match = cache.match_prefix(a + [1, 2])
    assert len(match.indices) == 30 and cache.loaded_tokens == 30
    check_content(pool, match.indices, a)
    check_accounting(cache, alloc)


def test_without_host_room_the_prefix_is_dropped():
    cache, pool, alloc = make_cache(device_slots=48, ratio=0.05, policy="write_back")
    a, b = list(range(100, 130)), list(range(200, 230))
    cache_tokens(cache, pool, alloc, a)
    cache_tokens(cache, pool, alloc, b)
    assert cache.peek_prefix(a)[0] == 0
    check_accounting(cache, alloc)


def test_inserting_over_host_only_nodes_adopts_the_new_slots():
    cache, pool, alloc = make_cache(device_slots=48, ratio=4.0, policy="write_through")
    a = list(range(100, 130))
    cache_tokens(cache, pool, alloc, a)
    cache.evict(30)
    assert cache.evictable_size() == 0 and cache.peek_prefix(a)[0] == 30
    # A request that recomputed the same tokens (no room to load them) caches its own copy.
    assert cache_tokens(cache, pool, alloc, a + [7, 8])
    match = cache.match_prefix(a + [7, 8])
    check_content(pool, match.indices, a + [7, 8])
    check_accounting(cache, alloc)


def test_selective_backup_during_a_match_cannot_drop_the_path_being_loaded():
    """A device node hit for the second time is backed up during a match; with the host pool
    full that evicts host-only nodes, which must not be the ones this match is loading."""
    cache, pool, alloc = make_cache(device_slots=16, ratio=0.4,   # 6 host slots
                                    policy="write_through_selective")
    tokens = list(range(1, 9))
    cache_tokens(cache, pool, alloc, tokens)
    cache.match_prefix([1, 2, 3, 4, 99])       # splits [1..4] | [5..8]; [1..4]'s first hit
    cache.evict(4)                             # [5..8] is backed up and goes host-only
    # [1..4]'s second hit backs it up, which needs host room; [5..8] is being loaded back.
    match = cache.match_prefix(tokens)
    check_content(pool, match.indices, tokens)
    check_accounting(cache, alloc)
    assert cache.peek_prefix(tokens)[0] == len(match.indices)


ops = st.lists(st.tuples(st.sampled_from(["cache", "match", "unlock", "evict"]),
                         st.integers(0, 5), st.integers(1, 24)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(["write_through", "write_back",
                                        "write_through_selective"]),
       page_size=st.sampled_from([1, 4]))
def test_random_operations_keep_both_tiers_consistent(ops, policy, page_size):
    cache, pool, alloc = make_cache(device_slots=64, ratio=2.0, policy=policy,
                                    page_size=page_size)
    # Prompts from a few families sharing prefixes of different lengths.
    families = [[1000 * f + i for i in range(40)] for f in range(3)]
    locked: list[tuple[object, torch.Tensor, list[int]]] = []
    for op, pick, n in ops:
        tokens = families[pick % 3][:n] + [9000 + pick * 10 + j for j in range(pick)]
        if op == "cache":
            cache_tokens(cache, pool, alloc, tokens)
        elif op == "match":
            m = cache.match_prefix(tokens)
            check_content(pool, m.indices, tokens)
            cache.inc_lock_ref(m.last_node)
            locked.append((m.last_node, m.indices, tokens))
        elif op == "unlock" and locked:
            node, _, _ = locked.pop(pick % len(locked))
            cache.dec_lock_ref(node)
        elif op == "evict":
            cache.evict(n)
        check_accounting(cache, alloc)
        for _, indices, toks in locked:   # a locked prefix is never moved or freed
            check_content(pool, indices, toks)
    for node, _, _ in locked:
        cache.dec_lock_ref(node)
    assert cache.protected_size() == 0
    check_accounting(cache, alloc)


# ---------------------------------------------------------------------- the engine

DOC = ("Radix trees share prefixes between requests, so a long document that many questions "
       "refer to is computed once. ") * 6


@pytest.mark.parametrize("variant", ["plain", "overlap+pages"])
def test_engine_outputs_equal_and_host_hits(make_engine, monkeypatch, variant):
    """A small device cache: the document's KV is pushed out by other prompts between the
    questions. With HiCache the later questions find it on the host; the tokens are the
    same either way (also under the overlap scheduler with 4-token pages)."""
    extra = {}
    if variant == "overlap+pages":
        monkeypatch.setenv("RADIXLM_OVERLAP_ON_CPU", "1")
        extra = {"page_size": 4}
    fillers = [f"Filler text number {i}: " + "lorem ipsum dolor sit amet " * 12
               for i in range(3)]
    sequence = [DOC + "Question: what is shared?"] + fillers + [DOC + "Question: why?"]
    params = {"max_new_tokens": 6, "temperature": 0}
    results = {}
    for hicache in (False, True):
        engine = make_engine(max_total_tokens=320, enable_hierarchical_cache=hicache,
                             hicache_ratio=8.0, **extra)
        outs = [engine.generate(p, params) for p in sequence]
        results[hicache] = outs
        engine.shutdown()
    assert [o["output_ids"] for o in results[False]] == [o["output_ids"] for o in results[True]]
    last_plain, last_hi = results[False][-1], results[True][-1]
    assert last_plain["meta_info"]["cached_tokens"] < 20       # the device lost the document
    assert last_hi["meta_info"]["cached_tokens"] >= 124        # the host had it (DOC: 127 tokens)


def test_bad_hicache_flags(make_engine):
    from radixlm.config import ServerArgs

    with pytest.raises(ValueError, match="--hicache-write-policy"):
        ServerArgs(hicache_write_policy="sometimes")
    with pytest.raises(ValueError, match="--enable-hierarchical-cache"):
        ServerArgs(enable_hierarchical_cache=True, disable_radix_cache=True)
    with pytest.raises(ValueError, match="--hicache-size: the host KV pool would take"):
        make_engine(enable_hierarchical_cache=True, hicache_size=1e6)
    # A directory for a disk tier that is not on: refused, not silently unused.
    with pytest.raises(ValueError, match="--hicache-storage-dir: needs --hicache-storage-b"):
        ServerArgs(enable_hierarchical_cache=True, hicache_storage_dir="/tmp/kv")


def test_a_bad_storage_dir_is_refused_with_the_flags(tmp_path):
    """Found when the flags are read, before any model loads."""
    from radixlm.config import ServerArgs
    a_file = tmp_path / "f"
    a_file.write_text("x")
    flags = dict(enable_hierarchical_cache=True, hicache_storage_backend="file")
    for bad, why in ((a_file, "is not a directory"), (a_file / "below", "is not a directory")):
        with pytest.raises(ValueError, match=f"--hicache-storage-dir: .*{why}"):
            ServerArgs(**flags, hicache_storage_dir=str(bad))
    ServerArgs(**flags, hicache_storage_dir=str(tmp_path / "new" / "dir"))   # can be made


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_a_host_pool_no_larger_than_the_device_pool_is_refused(ratio):
    from radixlm.config import ServerArgs
    from radixlm.mem_cache.hiradix_cache import HiCacheConfig
    with pytest.raises(ValueError, match="--hicache-ratio: must be > 1"):
        ServerArgs(enable_hierarchical_cache=True, hicache_ratio=ratio)
    with pytest.raises(ValueError, match=r"--hicache-size: the host KV pool \(\d+ tokens\) "
                                         r"must be larger than the device's \(1000 tokens\)"):
        HiCacheConfig(size_gib=ratio * 64_000 / 2 ** 30).host_slots(1000, bytes_per_token=64)
    assert HiCacheConfig(ratio=1.5).host_slots(1000, bytes_per_token=64) == 1500


# ---------------------------------------------------------------------- the file tier (L3)

def test_file_storage_checksums_and_failures(tmp_path, monkeypatch):
    import errno
    import os

    from radixlm.mem_cache.kv_storage import FileStorage

    store = FileStorage(str(tmp_path / "l3"))
    store.set("ab" * 32, b"payload")
    assert store.get("ab" * 32) == b"payload" and store.exists("ab" * 32)
    path = store._path("ab" * 32)
    with open(path, "r+b") as f:          # a flipped byte: a miss, counted
        f.seek(-1, 2)
        f.write(b"X")
    assert store.get("ab" * 32) is None and store.corrupt == 1
    with open(path, "wb") as f:           # truncated
        f.write(b"RLM")
    assert store.get("ab" * 32) is None and store.corrupt == 2
    assert not store.exists("ab" * 32)    # removed: the block is written again
    store.set("ab" * 32, b"payload")
    # A directory where a block's file goes is not a block, and the next write replaces it.
    os.makedirs(store._path("ef" * 32) + "/junk")
    assert not store.exists("ef" * 32) and store.get("ef" * 32) is None
    assert store.set("ef" * 32, b"y") and store.get("ef" * 32) == b"y"

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "replace", disk_full)
    store.set("cd" * 32, b"x")            # dropped, not raised
    assert store.failed_writes == 1 and not store.exists("cd" * 32)
    with pytest.raises(ValueError, match="--hicache-storage-dir"):
        FileStorage(str(path) + "/below-a-file")


def test_block_names_are_chained_over_the_prefix():
    from radixlm.mem_cache.kv_storage import block_names
    toks = list(range(1000, 1200))
    names = block_names("m", toks, 64)
    assert len(names) == 3 and len(set(names)) == 3           # whole blocks only
    assert block_names("m", toks[:150], 64) == names[:2]      # a shared prefix: shared names
    changed = block_names("m", [7] + toks[1:], 64)            # a token of block 0 changes all
    assert all(a != b for a, b in zip(changed, names))
    later = block_names("m", toks[:64] + [7] + toks[65:], 64)  # one of block 1: not block 0
    assert later[0] == names[0] and later[1:] != names[1:]
    assert block_names("other", toks, 64)[0] != names[0]
    assert block_names("m", [2**40], 1) != block_names("m", [2**40 + 1], 1)   # large ids


def make_file_cache(directory, device_slots=256, agree_on_blocks=None):
    pool = KVPool(device_slots, LAYERS, HEADS, DIM, torch.float32, "cpu")
    alloc = KVAllocator(device_slots, 1, "cpu")
    cache = HiRadixCache(ReqToTokenPool(4, 512, "cpu"), alloc, pool,
                         HiCacheConfig(ratio=1.0, storage_dir=str(directory),
                                       storage_namespace="test-model",
                                       agree_on_blocks=agree_on_blocks))
    return cache, pool, alloc


def test_a_new_cache_on_the_same_directory_finds_the_blocks(tmp_path):
    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 200 tokens: 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    second, pool2, alloc2 = make_file_cache(tmp_path)
    match = second.match_prefix(doc + [1, 2, 3])
    assert len(match.indices) == 192 and second.storage_hit_tokens == 192
    check_content(pool2, match.indices, doc)
    check_accounting(second, alloc2)
    # Another model (namespace) does not see them.
    other = HiRadixCache(ReqToTokenPool(4, 512, "cpu"), KVAllocator(256, 1, "cpu"),
                         KVPool(256, LAYERS, HEADS, DIM, torch.float32, "cpu"),
                         HiCacheConfig(storage_dir=str(tmp_path), storage_namespace="other"))
    assert len(other.match_prefix(doc).indices) == 0


def test_ranks_load_only_the_blocks_every_rank_found(tmp_path):
    """Under TP each rank asks the others how many blocks they found (the smallest count wins),
    at every round of a match until a round agrees on none, even one that found none itself,
    and loads only those."""
    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    asked, other_has = [], [1]

    def other_rank_found_one(n: int) -> int:    # the other rank has block 0 only
        asked.append(n)
        agreed = min(n, other_has[0])
        other_has[0] -= agreed
        return agreed
    second, pool2, alloc2 = make_file_cache(tmp_path, agree_on_blocks=other_rank_found_one)
    match = second.match_prefix(doc)
    assert asked == [3, 2] and len(match.indices) == 64 and second.storage_hit_tokens == 64
    check_content(pool2, match.indices, doc)
    check_accounting(second, alloc2)
    assert second.file_tier.arena.available() == second.file_tier.arena.num_blocks
    match = second.match_prefix(list(range(9000, 9100)))    # nothing stored: still asks
    assert asked == [3, 2, 0] and len(match.indices) == 0
    none, pool3, alloc3 = make_file_cache(tmp_path, agree_on_blocks=lambda n: 0)
    assert len(none.match_prefix(doc).indices) == 0 and none.storage_hit_tokens == 0
    check_accounting(none, alloc3)


def test_a_corrupt_block_takes_the_unreachable_ones_after_it_along(tmp_path):
    """The match stops at the first block it cannot read (corrupt: removed). The blocks after
    it can no longer be matched, and one of them corrupt too would stay so for good (the
    writer skips names whose file exists): they are removed, and written anew with the
    recomputed prefix."""
    import glob

    from radixlm.mem_cache.kv_storage import FileStorage
    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    files = glob.glob(str(tmp_path / "**" / "*.kv"), recursive=True)
    assert len(files) == 3
    for f in files:
        with open(f, "r+b") as fh:
            fh.seek(-2, 2)
            fh.write(b"??")
    second, pool2, alloc2 = make_file_cache(tmp_path)
    assert len(second.match_prefix(doc).indices) == 0
    assert glob.glob(str(tmp_path / "**" / "*.kv"), recursive=True) == []
    cache_tokens(second, pool2, alloc2, doc)     # computed again: every block written anew
    second.close()
    store = FileStorage(os.path.dirname(files[0]).rsplit(os.sep, 1)[0])
    rewritten = glob.glob(str(tmp_path / "**" / "*.kv"), recursive=True)
    assert len(rewritten) == 3
    assert all(store.get(os.path.basename(f)[:-3]) is not None for f in rewritten)


def test_blocks_read_ahead_of_the_match(tmp_path, monkeypatch):
    """A request's arrival reads its blocks on the prefetch thread; the match then takes them
    from memory (the store is not read again), with the same KV."""
    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    second, pool2, alloc2 = make_file_cache(tmp_path)
    tier = second.file_tier
    second.prefetch(doc + [1, 2, 3])
    tier.prefetcher.wait_idle()
    assert tier.prefetcher.held == 3 and tier.arena.available() == tier.arena.num_blocks - 3

    def no_disk(name, pieces):
        raise AssertionError("the match read the store although the blocks were read ahead")

    monkeypatch.setattr(tier.storage, "get_into", no_disk)
    match = second.match_prefix(doc + [1, 2, 3])
    assert len(match.indices) == 192 and second.storage_prefetched_tokens == 192
    check_content(pool2, match.indices, doc)
    assert tier.prefetcher.held == 0 and tier.prefetcher.taken == 3
    assert tier.arena.available() == tier.arena.num_blocks     # every staging block back
    check_accounting(second, alloc2)
    second.close()


def test_a_match_takes_staging_room_from_other_requests_reads(tmp_path):
    """The staging arena holds 4 blocks here (it is never larger than the device pool). Another
    request's 3 blocks read ahead leave 1 free: the match of a 3-block prefix takes the room of
    two of them, loads its whole prefix, and gives every staging block it used back; the other
    request (whose later blocks gave way first) still finds its first block read ahead and
    reads the two others itself."""
    first, pool, alloc = make_file_cache(tmp_path)
    doc, other = list(range(500, 700)), list(range(2000, 2200))   # 3 whole blocks each
    cache_tokens(first, pool, alloc, doc)
    first.file_tier.writer.flush()               # (the write staging holds 4 blocks here)
    cache_tokens(first, pool, alloc, other)
    first.close()
    second, pool2, alloc2 = make_file_cache(tmp_path)
    tier = second.file_tier
    assert tier.arena.num_blocks == 4
    second.prefetch(other)
    tier.prefetcher.wait_idle()
    assert tier.prefetcher.held == 3 and tier.arena.available() == 1
    match = second.match_prefix(doc + [1])
    assert len(match.indices) == 192 and second.storage_prefetched_tokens == 0
    check_content(pool2, match.indices, doc)
    assert tier.prefetcher.held == 1 and tier.arena.available() == 3
    match = second.match_prefix(other + [1])
    assert len(match.indices) == 192 and second.storage_prefetched_tokens == 64
    check_content(pool2, match.indices, other)
    assert tier.arena.available() == 4
    check_accounting(second, alloc2)
    second.close()


def test_a_prefix_longer_than_the_staging_arena_loads_in_rounds(tmp_path, monkeypatch):
    """With room for 2 blocks in the staging arena, a 3-block prefix loads in two rounds (the
    first round's copy frees its blocks), whole; under TP each round's count is agreed on,
    and the last round finds nothing."""
    from radixlm.mem_cache import file_tier

    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    monkeypatch.setattr(file_tier, "STAGING_MAX_BYTES", 2 * first.file_tier.block_bytes)
    asked = []

    def agree(n: int) -> int:
        asked.append(n)
        return n
    second, pool2, alloc2 = make_file_cache(tmp_path, agree_on_blocks=agree)
    assert second.file_tier.arena.num_blocks == 2
    match = second.match_prefix(doc + [1])
    assert len(match.indices) == 192 and second.storage_hit_tokens == 192
    assert asked == [2, 1, 0]
    check_content(pool2, match.indices, doc)
    assert second.file_tier.arena.available() == 2
    check_accounting(second, alloc2)
    second.close()
    alone, pool3, alloc3 = make_file_cache(tmp_path)       # one rank: no agreement to ask
    match = alone.match_prefix(doc + [1])
    assert len(match.indices) == 192 and alone.storage_hit_tokens == 192
    check_content(pool3, match.indices, doc)
    alone.close()


def tiny_arena(num_blocks: int):
    """A staging arena of 100-byte blocks (one token of one layer: K and V of 50 bytes)."""
    from radixlm.mem_cache.staging_arena import StagingArena
    return StagingArena(KVPool(4, 1, 1, 50, torch.uint8, "cpu"), 1, num_blocks)


def staged_bytes(arena, block: int | None) -> bytes | None:
    return None if block is None else b"".join(bytes(p) for p in arena.pieces(block))


def test_prefetcher_stops_at_a_miss_and_holds_at_most_its_arena(tmp_path, monkeypatch):
    from radixlm.mem_cache import kv_storage
    from radixlm.mem_cache.kv_storage import FileStorage, StoragePrefetcher

    store = FileStorage(str(tmp_path))
    for name in ("a", "b", "c", "e"):
        store.set(name, name.encode() * 100)
    # Read by several threads at once: every block is what the store holds.
    arena = tiny_arena(8)
    prefetcher = StoragePrefetcher(store, arena, threads=3)
    prefetcher.prefetch(["a", "b", "c", "d"])
    prefetcher.wait_idle()
    blocks = [prefetcher.take(n) for n in "abcd"]
    assert [staged_bytes(arena, b) for b in blocks] == [b"a" * 100, b"b" * 100, b"c" * 100, None]
    assert prefetcher.held == 0 and prefetcher.taken == 3 and arena.available() == 5
    arena.release(blocks[:3])
    prefetcher.close()
    # One thread: nothing after the miss at d is read (chained names: nothing after it can
    # match).
    prefetcher = StoragePrefetcher(store, arena, threads=1)
    prefetcher.prefetch(["a", "b", "c", "d", "e"])
    prefetcher.wait_idle()
    assert prefetcher.held == 3 and arena.available() == 5
    assert prefetcher.take("e") is None and prefetcher.take("d") is None
    assert staged_bytes(arena, prefetcher.take("c")) == b"c" * 100 and prefetcher.held == 2
    prefetcher.close()                     # (the blocks it held go back; c is ours)
    assert arena.available() == 7
    # With the arena full reading stops; the match reads the rest.
    arena = tiny_arena(2)
    prefetcher = StoragePrefetcher(store, arena, threads=1)
    prefetcher.prefetch(["a", "b", "c"])
    prefetcher.wait_idle()
    assert prefetcher.held == 2 and prefetcher.take("c") is None and arena.available() == 0
    # A match that needs room takes it from the newest block read ahead, not from its own.
    given = prefetcher.give_way(keep={"b"})        # (handed over, not freed: a)
    assert given is not None and arena.available() == 0
    arena.release([given])
    assert prefetcher.take("a") is None and prefetcher.held == 1
    assert prefetcher.give_way(keep={"b"}) is None
    # Blocks never taken give way once stale.
    monkeypatch.setattr(kv_storage, "PREFETCH_STALE_S", 0.0)
    prefetcher.prefetch(["a", "e"])
    prefetcher.wait_idle()
    assert prefetcher.take("b") is None
    assert staged_bytes(arena, prefetcher.take("e")) == b"e" * 100
    prefetcher.close()
    # A store that raises: a miss for the match (which reads it itself), never a hang, and
    # no staging block lost.
    broken = FileStorage(str(tmp_path))
    broken.get_into = lambda name, pieces: 1 / 0
    arena = tiny_arena(2)
    prefetcher = StoragePrefetcher(broken, arena, threads=2)
    prefetcher.prefetch(["a", "b"])
    assert prefetcher.take("a") is None and prefetcher.take("b") is None
    assert arena.available() == 2
    prefetcher.close()
    # Closed with reads queued: they are called off, and nothing waits for them.
    prefetcher = StoragePrefetcher(store, arena, threads=1)
    prefetcher.prefetch(["a", "b", "c"])
    prefetcher.close()
    assert prefetcher.take("c") is None and prefetcher.held == 0
    prefetcher.wait_idle()
    assert arena.available() == 2


def test_file_storage_reads_in_place_what_get_returns(tmp_path):
    """`get_into` (the staging arena's path) fills the pieces with what `get` returns, and
    refuses what `get` refuses: a flipped byte, a truncated file, another size."""
    from radixlm.mem_cache.kv_storage import FileStorage, KVStorage

    store = FileStorage(str(tmp_path))
    payload = bytes(range(200)) * 3
    store.set("x", payload)
    arena = tiny_arena(6)
    pieces = [p for b in range(6) for p in arena.pieces(b)]       # 12 pieces of 50 bytes
    assert store.get_into("x", pieces) and b"".join(map(bytes, pieces)) == payload
    assert KVStorage.get_into(store, "x", pieces)                 # the interface's default
    assert KVStorage.set_pieces(store, "y", pieces[:4]) and store.get("y") == payload[:200]
    assert store.set_pieces("z", pieces[4:]) and store.get("z") == payload[200:]
    assert not KVStorage.get_into(store, "x", pieces[:-1])        # another size
    assert not store.get_into("x", pieces[:-1])
    assert not store.get_into("missing", pieces) and store.corrupt == 1
    # A file that fails its checks is removed, so that the writer writes the block again.
    assert not store.exists("x") and store.set("x", payload)
    with open(store._path("x"), "r+b") as f:
        f.seek(-1, 2)
        f.write(b"X")
    assert not store.get_into("x", pieces) and store.corrupt == 2 and not store.exists("x")
    store.set("x", payload[:-1] + b"X")                           # get: the same checks
    with open(store._path("x"), "r+b") as f:
        f.seek(-1, 2)
        f.write(b"Y")
    assert store.get("x") is None and store.corrupt == 3 and not store.exists("x")


def test_file_storage_reads_files_of_the_sha256_format(tmp_path, monkeypatch):
    """Blocks are written with a CRC32 now; files of earlier builds (magic RLMKV1, SHA-256)
    are still read, by `get` and `get_into`, and checked against their own checksum. Reads
    into many pieces go in preadv batches of at most IOV_MAX buffers."""
    import hashlib

    from radixlm.mem_cache import kv_storage
    from radixlm.mem_cache.kv_storage import FileStorage

    store = FileStorage(str(tmp_path))
    payload = bytes(range(200)) * 3
    os.makedirs(os.path.dirname(store._path("old")), exist_ok=True)
    with open(store._path("old"), "wb") as f:
        f.write(b"RLMKV1" + hashlib.sha256(payload).digest() + payload)
    store.set("new", payload)
    with open(store._path("new"), "rb") as f:
        assert f.read(6) == b"RLMKV2"
    monkeypatch.setattr(kv_storage, "_IOV_MAX", 5)                # 13 views: 3 calls
    arena = tiny_arena(6)
    pieces = [p for b in range(6) for p in arena.pieces(b)]       # 12 pieces of 50 bytes
    for name in ("old", "new"):
        assert store.get(name) == payload
        for p in pieces:
            p[:] = bytes(p.nbytes)
        assert store.get_into(name, pieces) and b"".join(map(bytes, pieces)) == payload
    with open(store._path("old"), "r+b") as f:                    # a flipped payload byte
        f.seek(100)
        f.write(b"X")
    assert store.get("old") is None and not store.get_into("old", pieces)
    assert store.corrupt == 1 and not store.exists("old")        # (removed: written again)
    with open(store._path("new"), "r+b") as f:                    # an unknown magic
        f.write(b"RLMKV9")
    assert not store.get_into("new", pieces) and store.get("new") is None
    assert store.corrupt == 2 and not store.exists("new")


def test_background_writer_makes_the_bytes_on_its_thread_and_bounds_what_is_queued(tmp_path):
    import threading
    import time

    from radixlm.mem_cache.kv_storage import BackgroundWriter, FileStorage

    store = FileStorage(str(tmp_path))
    writer = BackgroundWriter(store, max_pending_bytes=250)
    gate, threads = threading.Event(), []

    def block_bytes() -> bytes:       # (a device -> host copy, waited for on the thread)
        threads.append(threading.current_thread().name)
        gate.wait(10)
        return b"a" * 200

    def broken() -> bytes:
        raise RuntimeError("the copy failed")

    assert writer.submit("a" * 64, block_bytes, 200)
    assert not writer.submit("b" * 64, b"b" * 100)      # 300 bytes queued > 250: dropped
    assert writer.dropped == 1
    gate.set()
    writer.flush()
    assert threads == ["kv-storage-writer"] and store.get("a" * 64) == b"a" * 200
    assert writer.pending_bytes == 0
    assert writer.submit("b" * 64, broken, 100)         # not stored, and serving goes on
    assert writer.submit("c" * 64, b"c" * 100)
    writer.flush()
    assert store.get("b" * 64) is None and store.get("c" * 64) == b"c" * 100
    assert writer.pending_bytes == 0 and writer.has_room(250)
    with pytest.raises(ValueError, match="nbytes"):
        writer.submit("d" * 64, block_bytes)
    # A full queue (one write): dropped, and its bytes given back.
    full = BackgroundWriter(store, max_pending=1)
    gate.clear()
    assert full.submit("e" * 64, block_bytes, 10)
    for _ in range(1000):                              # the thread holds e (waiting on gate)
        if len(threads) == 2:
            break
        time.sleep(0.01)
    assert full.submit("f" * 64, b"f") and not full.has_room(1)   # f fills the queue
    assert not full.submit("g" * 64, b"g") and full.pending_bytes == 11
    gate.set()
    full.flush()
    assert full.pending_bytes == 0 and full.dropped == 1


def test_a_block_whose_write_failed_is_offered_again(tmp_path, monkeypatch):
    """A write that fails (here: the disk is full) does not leave the block marked as stored:
    the next time its key is cached it is written, and a restarted cache finds it."""
    import errno
    import os

    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    real_replace = os.replace

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "replace", disk_full)
    cache_tokens(first, pool, alloc, doc)
    first.file_tier.writer.flush()
    tier = first.file_tier
    assert tier.storage.failed_writes == 3 and not tier._stored
    monkeypatch.setattr(os, "replace", real_replace)
    cache_tokens(first, pool, alloc, doc)        # the same key cached again: offered again
    first.close()
    assert tier.storage.failed_writes == 3
    second, pool2, alloc2 = make_file_cache(tmp_path)
    match = second.match_prefix(doc)
    assert len(match.indices) == 192 and second.storage_hit_tokens == 192
    check_content(pool2, match.indices, doc)
    second.close()


def test_blocks_wait_for_write_staging_and_are_offered_again(tmp_path, monkeypatch):
    """Blocks being written are staged (one copy for all of an insert's new blocks) and hold
    their staging block until written: with room for 2, a 3-block key queues 2 writes while
    the writer is stuck, and the third is written when the key is cached again."""
    import threading

    from radixlm.mem_cache import file_tier

    monkeypatch.setattr(file_tier, "WRITE_STAGING_MAX_BYTES", 2 * 64 * LAYERS * 2 * HEADS * DIM * 4)
    first, pool, alloc = make_file_cache(tmp_path)
    tier = first.file_tier
    assert tier.write_arena.num_blocks == 2
    gate, real = threading.Event(), tier.storage.set_pieces

    def stuck(name, pieces):
        gate.wait(10)
        return real(name, pieces)
    monkeypatch.setattr(tier.storage, "set_pieces", stuck)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    assert len(tier._stored) == 2 and tier.write_arena.available() == 0
    gate.set()
    tier.writer.flush()
    assert tier.write_arena.available() == 2
    cache_tokens(first, pool, alloc, doc)        # cached again: the third block now
    first.close()
    assert len(tier._stored) == 3 and tier.write_arena.available() == 2
    second, pool2, alloc2 = make_file_cache(tmp_path)
    match = second.match_prefix(doc)
    assert len(match.indices) == 192
    check_content(pool2, match.indices, doc)
    second.close()


def test_a_staging_copy_that_raises_leaks_no_block(tmp_path, monkeypatch):
    """If the copy into the write staging raises, its blocks go back and their names are not
    marked stored: the next insert of the key writes them."""
    first, pool, alloc = make_file_cache(tmp_path, device_slots=512)
    tier = first.file_tier
    free = tier.write_arena.available()

    def broken(*args):
        raise RuntimeError("copy failed")
    monkeypatch.setattr(tier.write_copier, "to_host", broken)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    with pytest.raises(RuntimeError, match="copy failed"):
        cache_tokens(first, pool, alloc, doc)
    assert tier.write_arena.available() == free and not tier._stored
    monkeypatch.undo()
    assert cache_tokens(first, pool, alloc, doc)  # (the failed insert's slots stay taken)
    first.close()
    assert len(tier._stored) == 3 and tier.write_arena.available() == free


def test_engine_restart_hits_the_file_tier(make_engine, tmp_path):
    import glob

    prompt = DOC + "Question: what is shared?"
    params = {"max_new_tokens": 6, "temperature": 0}
    plain = make_engine().generate(prompt, params)
    kwargs = dict(enable_hierarchical_cache=True, hicache_storage_backend="file",
                  hicache_storage_dir=str(tmp_path / "l3"))
    first = make_engine(**kwargs)
    assert first.generate(prompt, params)["meta_info"]["cached_tokens"] == 0
    first.shutdown()                               # queued block writes are flushed
    files = glob.glob(str(tmp_path / "l3" / "*" / "*.kv"))
    assert len(files) >= 2                          # 132 prompt tokens: 2 blocks of 64
    again = make_engine(**kwargs).generate(prompt, params)
    assert again["output_ids"] == plain["output_ids"]
    assert again["meta_info"]["cached_tokens"] == 128
    for f in files:                                 # corrupt every block: misses, same tokens
        with open(f, "r+b") as fh:
            fh.seek(-2, 2)
            fh.write(b"??")
    third_engine = make_engine(**kwargs)
    third = third_engine.generate(prompt, params)
    assert third["output_ids"] == plain["output_ids"]
    assert third["meta_info"]["cached_tokens"] == 0
    third_engine.shutdown()           # the broken files were removed, and the blocks written again
    # Every block is whole again: also the second, which the reads stopped short of (the
    # first failed), and which the writer would have skipped as present
    from radixlm.mem_cache.kv_storage import FileStorage
    store = FileStorage(str(tmp_path / "l3"))
    rewritten = glob.glob(str(tmp_path / "l3" / "*" / "*.kv"))
    assert len(rewritten) >= 2
    assert all(store.get(os.path.basename(f)[:-3]) is not None for f in rewritten)
    fourth = make_engine(**kwargs).generate(prompt, params)
    assert fourth["output_ids"] == plain["output_ids"]
    assert fourth["meta_info"]["cached_tokens"] == 128


@pytest.mark.slow
def test_engine_restart_hits_the_file_tier_at_tp2(make_engine, tmp_path, smollm_dir):
    """Two gloo ranks, each storing its slice of every block: a restart finds them and gives the
    same tokens; with one of the files broken the ranks agree on the shorter prefix (no hang, no
    mismatched trees) and the tokens are still the same."""
    import glob

    from helpers import tiny_checkpoint

    model = tiny_checkpoint(tmp_path / "llama", "llama", num_kv_heads=2)
    prompt = DOC + "Question: what is shared?"
    params = {"max_new_tokens": 6, "temperature": 0}
    kwargs = dict(model_path=model, tokenizer_path=smollm_dir, tp_size=2,
                  max_total_tokens=2048, enable_hierarchical_cache=True,
                  hicache_storage_backend="file", hicache_storage_dir=str(tmp_path / "l3"))
    first = make_engine(**kwargs)
    plain = first.generate(prompt, params)
    assert plain["meta_info"]["cached_tokens"] == 0
    first.shutdown()
    files = sorted(glob.glob(str(tmp_path / "l3" / "*" / "*.kv")))
    assert len(files) == 4                          # 2 blocks of 64 tokens x 2 ranks
    again = make_engine(**kwargs)
    out = again.generate(prompt, params)
    assert out["output_ids"] == plain["output_ids"]
    assert out["meta_info"]["cached_tokens"] == 128
    again.shutdown()
    with open(files[0], "r+b") as fh:               # one rank's copy of one block
        fh.seek(-2, 2)
        fh.write(b"??")
    out = make_engine(**kwargs).generate(prompt, params)
    assert out["output_ids"] == plain["output_ids"]
    assert out["meta_info"]["cached_tokens"] in (0, 64)


def test_admission_loads_a_host_prefix_only_for_a_request_that_fits():
    """Matching copies a host-tier prefix into device slots, evicting others for room: the
    scheduler must not match (load) for a request it then turns away, as it would every step."""
    from radixlm.scheduler.prefill import AddResult

    cache, pool, alloc = make_cache(device_slots=48, ratio=4.0, policy="write_back")
    a, b = list(range(100, 130)), list(range(200, 230))
    assert cache_tokens(cache, pool, alloc, a) and cache_tokens(cache, pool, alloc, b)
    assert cache.peek_load(a + [1]).to_load == 30 and cache.peek_load(b).to_load == 0
    held = alloc.alloc(alloc.available_size())     # a running request holds the free slots
    prompt = a + list(range(300, 310))
    # 30 tokens to load + 10 new do not fit the 30 evictable ones: nothing is loaded.
    assert _admit(cache, alloc, prompt) == AddResult.NO_ROOM
    assert cache.loaded_tokens == 0 and cache.peek_prefix(b)[0] == 30
    assert alloc.available_size() == 0 and cache.evictable_size() == 30   # b still on device
    alloc.free(held)
    assert _admit(cache, alloc, prompt) == AddResult.ADDED
    assert cache.loaded_tokens == 30
    check_accounting(cache, alloc)


def test_admission_loads_a_stored_prefix_only_for_a_request_that_fits(tmp_path):
    """The file tier's part of a prefix counts in the admission check as the host tier's does:
    a request whose stored blocks would not fit with its new tokens is turned away before
    anything is read or loaded (no device cache evicted for it); under TP the ranks agree on
    the count (once per peek, only when the key has a whole block past the tree's part)."""
    from radixlm.scheduler.prefill import AddResult

    first, pool, alloc = make_file_cache(tmp_path)
    doc = list(range(500, 700))                  # 3 whole blocks of 64
    cache_tokens(first, pool, alloc, doc)
    first.close()
    asked: list[int] = []

    def agree(n: int) -> int:
        asked.append(n)
        return n
    cache, pool, alloc = make_file_cache(tmp_path, agree_on_blocks=agree)
    peek = cache.peek_load(doc + [1])
    assert (peek.cached, peek.to_load, asked) == (192, 192, [3])
    assert cache.peek_load(doc[:60]).to_load == 0 and asked == [3]     # no whole block
    other = list(range(2000, 2100))
    assert cache_tokens(cache, pool, alloc, other)                     # 100 cached tokens
    held = alloc.alloc(alloc.available_size())   # a running request holds the free slots
    prompt = doc + list(range(900, 910))
    # 192 tokens to load + 10 new do not fit the 100 evictable ones: nothing is read.
    assert _admit(cache, alloc, prompt) == AddResult.NO_ROOM
    assert cache.file_tier.hit_tokens == 0 and cache.peek_prefix(other)[0] == 100
    alloc.free(held)
    assert _admit(cache, alloc, prompt) == AddResult.ADDED
    assert cache.file_tier.hit_tokens == 192
    cache.close()


def _admit(cache, alloc, tokens: list[int], chunk: int | None = None,
           before: list[int] | None = None):
    """PrefillAdder.add for one request (after one that takes `before` new tokens, if given);
    returns its result and releases the locks the adder took."""
    from radixlm.sampling.params import SamplingParams
    from radixlm.scheduler.prefill import PrefillAdder
    from radixlm.scheduler.request import Req

    def req(ids: list[int], rid: str) -> Req:
        return Req(rid=rid, origin_input_ids=ids, sampling_params=SamplingParams(max_new_tokens=4),
                   seed=0, arrival=0)

    adder = PrefillAdder(cache, alloc, [], 0.0, 1 << 20, chunk, 4)
    if before is not None:
        adder.add(req(before, "first"))
    result = adder.add(req(tokens, "q"))
    for r in adder.added:
        if r.last_node is not None:
            cache.dec_lock_ref(r.last_node)
    return result


def test_admission_check_counts_the_device_part_of_the_prefix_it_would_lock():
    """A prefix partly on the device (unlocked, so counted as evictable budget) and partly on
    the host: locking it takes both out of the budget, so the request must not load first and
    be refused after."""
    from radixlm.scheduler.prefill import AddResult

    cache, pool, alloc = make_cache(device_slots=48, ratio=4.0, policy="write_back")
    a, b = list(range(100, 130)), list(range(200, 230))
    assert cache_tokens(cache, pool, alloc, a)
    assert cache_tokens(cache, pool, alloc, a[:20] + b[:10])   # a[20:] goes to the host
    assert cache.peek_load(a).to_load == 10 and cache.evictable_size() == 30
    held = alloc.alloc(alloc.available_size() - 5)      # 5 free slots left
    # Budget 5 + 30 = 35: 10 new tokens + 10 to load fit it, but not once the 20 device
    # tokens of the prefix are locked too.
    assert _admit(cache, alloc, a + list(range(300, 310))) == AddResult.NO_ROOM
    assert cache.loaded_tokens == 0
    alloc.free(held)
    assert _admit(cache, alloc, a + list(range(300, 310))) == AddResult.ADDED
    assert cache.loaded_tokens == 10


def test_admission_with_the_chunk_budget_used_up_loads_nothing():
    from radixlm.scheduler.prefill import AddResult

    cache, pool, alloc = make_cache(device_slots=48, ratio=4.0, policy="write_back")
    a, b = list(range(100, 130)), list(range(200, 230))
    assert cache_tokens(cache, pool, alloc, a) and cache_tokens(cache, pool, alloc, b)
    assert cache.peek_load(a).to_load == 30
    result = _admit(cache, alloc, a + [1, 2], chunk=8, before=list(range(400, 408)))
    assert result == AddResult.NO_ROOM and cache.loaded_tokens == 0
