"""Tests for KVAllocator: slot/page bookkeeping for page sizes 1, 4 and 16.

The allocator is the ground truth of the memory accounting invariant, so these tests check it
directly against a simple model (a set of owned pages) instead of trusting available_size().
"""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.mem_cache.allocator import JOIN_AFTER_FREES, KVAllocator

PAGE_SIZES = [1, 4, 16]


def _pages(slots: torch.Tensor, page_size: int) -> set[int]:
    return set((slots // page_size).tolist())


def _free_pages(a: KVAllocator) -> set[int]:
    # Read the free list itself on purpose: the test must see what alloc will hand out next,
    # not a count the allocator reports about itself.
    return set(a.free_pages().tolist())


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_initial_state(page_size: int) -> None:
    a = KVAllocator(num_slots=10 * page_size + page_size - 1, page_size=page_size, device="cpu")
    # The trailing page_size - 1 slots don't make a full page; page 0 is the padding page.
    assert a.num_pages == 10
    assert a.total_size == 9 * page_size
    assert a.available_size() == a.total_size
    assert _free_pages(a) == set(range(1, 10))


def test_constructor_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        KVAllocator(num_slots=16, page_size=0, device="cpu")
    with pytest.raises(ValueError):
        KVAllocator(num_slots=7, page_size=4, device="cpu")  # one page: only the padding page


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_shape_and_page_boundaries(page_size: int) -> None:
    a = KVAllocator(num_slots=64 * page_size, page_size=page_size, device="cpu")
    seen: set[int] = set()
    for n in [1, page_size, page_size + 1, 3 * page_size - 1, 5]:
        before = a.available_size()
        slots = a.alloc(n)
        assert slots is not None and slots.dtype == torch.int64 and slots.numel() == n
        # Fresh allocations start on a page boundary and keep offset-in-page == position, which
        # is what lets alloc_extend continue a partial page by slot arithmetic.
        assert all(int(s) % page_size == i % page_size for i, s in enumerate(slots))
        assert int(slots[0]) % page_size == 0
        assert not (_pages(slots, page_size) & {0}), "padding page handed out"
        # Whole pages are taken even for a partial last page.
        assert before - a.available_size() == -(-n // page_size) * page_size
        assert not (set(slots.tolist()) & seen), "slot handed out twice"
        seen |= set(slots.tolist())


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_zero_tokens(page_size: int) -> None:
    a = KVAllocator(num_slots=4 * page_size, page_size=page_size, device="cpu")
    slots = a.alloc(0)
    assert slots is not None and slots.numel() == 0
    assert a.available_size() == a.total_size


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_out_of_memory_has_no_side_effects(page_size: int) -> None:
    a = KVAllocator(num_slots=5 * page_size, page_size=page_size, device="cpu")  # 4 usable pages
    first = a.alloc(3 * page_size)
    assert first is not None
    free_before = _free_pages(a)
    assert a.alloc(page_size + 1) is None  # needs 2 pages, 1 left
    assert a.available_size() == page_size
    assert _free_pages(a) == free_before
    last = a.alloc(page_size)  # exactly what is left still fits
    assert last is not None and a.available_size() == 0
    assert a.alloc(1) is None
    assert a.alloc(0) is not None  # nothing asked, nothing needed


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_returns_whole_pages_and_double_free_raises(page_size: int) -> None:
    a = KVAllocator(num_slots=8 * page_size, page_size=page_size, device="cpu")
    x = a.alloc(2 * page_size + 1)  # 3 pages
    y = a.alloc(page_size)
    assert x is not None and y is not None
    a.free(x)
    assert a.available_size() == a.total_size - page_size
    with pytest.raises(RuntimeError):
        a.free(x)
    with pytest.raises(RuntimeError):
        a.free(x[:1])  # any slot of an already-free page
    # Freeing the first slot of a page frees the whole page (pages have one owner).
    a.free(y[:1])
    assert a.available_size() == a.total_size
    with pytest.raises(RuntimeError):
        a.free(torch.tensor([0]))  # the padding page is never free-able
    a.free(torch.empty(0, dtype=torch.int64))  # no-op


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_free_accepts_int32_rows(page_size: int) -> None:
    # The scheduler frees straight out of ReqToTokenPool rows, which are int32.
    a = KVAllocator(num_slots=8 * page_size, page_size=page_size, device="cpu")
    x = a.alloc(2 * page_size)
    assert x is not None
    a.free(x.to(torch.int32))
    assert a.available_size() == a.total_size


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_fills_partial_last_page_first(page_size: int) -> None:
    a = KVAllocator(num_slots=64 * page_size, page_size=page_size, device="cpu")
    rng = random.Random(page_size)
    row: list[int] = []
    # Another request allocating in between makes sure "the next free page" is not simply the
    # next page after ours, so a wrong continuation would show up.
    other = a.alloc(1)
    assert other is not None
    taken = set(other.tolist())
    while len(row) < 20 * page_size:
        k = rng.randint(1, 2 * page_size + 1)
        seq_len = len(row)
        last_loc = row[-1] if row else -1
        before = a.available_size()
        locs = a.alloc_extend(seq_len=seq_len, last_loc=last_loc, num_tokens=k)
        assert locs is not None and locs.numel() == k
        new_pages = (before - a.available_size()) // page_size
        assert new_pages == a.pages_needed(seq_len, k)
        if page_size > 1 and seq_len % page_size:
            fill = min(page_size - seq_len % page_size, k)
            assert locs[:fill].tolist() == list(range(last_loc + 1, last_loc + 1 + fill))
        for i, s in enumerate(locs.tolist()):
            assert s % page_size == (seq_len + i) % page_size
        assert not (set(locs.tolist()) & taken)
        taken |= set(locs.tolist())
        row.extend(locs.tolist())
        if rng.random() < 0.3:
            junk = a.alloc(rng.randint(1, page_size))
            assert junk is not None
            taken |= set(junk.tolist())
    # The request owns exactly ceil(len/page) pages.
    assert len({s // page_size for s in row}) == -(-len(row) // page_size)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_accepts_tensor_last_loc(page_size: int) -> None:
    # The scheduler passes row[kv_allocated_len - 1], a 0-d int32 tensor, not a Python int.
    a = KVAllocator(num_slots=16 * page_size, page_size=page_size, device="cpu")
    first = a.alloc(1)
    assert first is not None
    row = first.to(torch.int32)
    locs = a.alloc_extend(seq_len=1, last_loc=row[0], num_tokens=page_size + 1)
    assert locs is not None and locs.dtype == torch.int64 and locs.numel() == page_size + 1
    if page_size > 1:
        assert int(locs[0]) == int(row[0]) + 1


@pytest.mark.parametrize("page_size", [4, 16])
def test_alloc_extend_within_last_page_needs_no_memory(page_size: int) -> None:
    a = KVAllocator(num_slots=3 * page_size, page_size=page_size, device="cpu")
    x = a.alloc(1)
    y = a.alloc(page_size)
    assert x is not None and y is not None and a.available_size() == 0
    # Room left in x's page: succeeds although the allocator is empty.
    locs = a.alloc_extend(seq_len=1, last_loc=int(x[0]), num_tokens=page_size - 1)
    assert locs is not None and locs.tolist() == list(range(int(x[0]) + 1, int(x[0]) + page_size))
    assert a.pages_needed(1, page_size - 1) == 0
    # One token more than the page holds: out of memory, nothing taken.
    assert a.alloc_extend(seq_len=1, last_loc=int(x[0]), num_tokens=page_size) is None
    assert a.available_size() == 0


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_alloc_extend_out_of_memory_has_no_side_effects(page_size: int) -> None:
    a = KVAllocator(num_slots=4 * page_size, page_size=page_size, device="cpu")  # 3 usable pages
    row = a.alloc(page_size + 1)  # 2 pages; with page_size 1 that is 2 pages of 1
    assert row is not None
    free_before = _free_pages(a)
    avail = a.available_size()
    k = avail + (page_size - (row.numel() % page_size)) % page_size + 1
    assert a.pages_needed(row.numel(), k) * page_size > avail
    assert a.alloc_extend(seq_len=row.numel(), last_loc=int(row[-1]), num_tokens=k) is None
    assert _free_pages(a) == free_before and a.available_size() == avail
    # One token less fits exactly.
    locs = a.alloc_extend(seq_len=row.numel(), last_loc=int(row[-1]), num_tokens=k - 1)
    assert locs is not None and a.available_size() == 0


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pages_needed_matches_alloc_extend_exhaustively(page_size: int) -> None:
    for seq_len in range(0, 3 * page_size + 1):
        for k in range(0, 3 * page_size + 1):
            a = KVAllocator(num_slots=16 * page_size, page_size=page_size, device="cpu")
            last_loc = -1
            if seq_len:
                pre = a.alloc(seq_len)
                assert pre is not None
                last_loc = int(pre[-1])
            before = a.available_size()
            locs = a.alloc_extend(seq_len=seq_len, last_loc=last_loc, num_tokens=k)
            assert locs is not None and locs.numel() == k
            assert (before - a.available_size()) == a.pages_needed(seq_len, k) * page_size


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_random_alloc_free_against_model(page_size: int) -> None:
    a = KVAllocator(num_slots=20 * page_size, page_size=page_size, device="cpu")
    rng = random.Random(1000 + page_size)
    owned: list[torch.Tensor] = []
    for _ in range(300):
        if owned and rng.random() < 0.45:
            a.free(owned.pop(rng.randrange(len(owned))))
        else:
            n = rng.randint(1, 3 * page_size)
            before = a.available_size()
            got = a.alloc(n)
            if got is None:
                assert -(-n // page_size) * page_size > before
                assert a.available_size() == before
            else:
                owned.append(got)
        held = [p for s in owned for p in _pages(s, page_size)]
        assert len(held) == len(set(held)), "page owned twice"
        free = a.free_pages().tolist()
        assert len(free) == len(set(free)), "page on the free list twice"
        assert not (set(held) & set(free))
        assert set(held) | set(free) == set(range(1, a.num_pages))
        assert a.available_size() + len(held) * page_size == a.total_size
    for s in owned:
        a.free(s)
    assert a.available_size() == a.total_size


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_clear(page_size: int) -> None:
    a = KVAllocator(num_slots=6 * page_size, page_size=page_size, device="cpu")
    assert a.alloc(3 * page_size) is not None
    a.clear()
    assert a.available_size() == a.total_size
    assert _free_pages(a) == set(range(1, a.num_pages))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_negative_counts_rejected(page_size: int) -> None:
    # alloc(-5) used to slice the free list from its end and hand out nearly every page.
    a = KVAllocator(num_slots=10 * page_size, page_size=page_size, device="cpu")
    with pytest.raises(ValueError):
        a.alloc(-5)
    x = a.alloc(1)
    assert x is not None
    with pytest.raises(ValueError):
        a.alloc_extend(seq_len=1, last_loc=int(x[0]), num_tokens=-5)
    assert a.available_size() == a.total_size - page_size


@pytest.mark.parametrize("page_size", [4, 16])
def test_alloc_extend_rejects_inconsistent_last_loc(page_size: int) -> None:
    # last_loc=-1 for a non-empty request used to hand out the padding page's slots.
    a = KVAllocator(num_slots=10 * page_size, page_size=page_size, device="cpu")
    x = a.alloc(3)
    assert x is not None
    with pytest.raises(ValueError):
        a.alloc_extend(seq_len=3, last_loc=-1, num_tokens=2)
    with pytest.raises(ValueError):
        a.alloc_extend(seq_len=3, last_loc=int(x[1]), num_tokens=2)  # off by one position
    assert a.available_size() == a.total_size - page_size


def test_freed_pages_are_handed_out_in_the_order_they_were_freed() -> None:
    """Frees join the free list lazily (a device op saved per free); what alloc hands out
    must not change: the pages in free order, after the ones that were free before."""
    a = KVAllocator(num_slots=12, page_size=1, device="cpu")
    every = a.alloc(9).tolist()             # pages 1..9 of 11
    a.free(torch.tensor(every[6:8]))
    a.free(torch.tensor(every[0:2]))
    assert a.available_size() == 6
    assert a.alloc(6).tolist() == [10, 11] + every[6:8] + every[0:2]
    assert a.alloc(1) is None


def test_many_frees_are_joined() -> None:
    a = KVAllocator(num_slots=400, page_size=1, device="cpu")
    held = a.alloc(300)
    for i in range(300):
        a.free(held[i:i + 1])
    assert len(a._freed) < JOIN_AFTER_FREES
    assert a.available_size() == a.total_size
    assert sorted(a.free_pages().tolist()) == list(range(1, 400))
