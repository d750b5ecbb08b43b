"""Hands out KV slots, one token (page_size 1) or one page of tokens at a time.

A slot index addresses a row of every KVPool buffer. With page_size P, slot s lies in page s // P,
and a page is always owned by exactly one party (a running request or one radix-tree node), so
freeing is done a whole page at a time. Page 0 is reserved as the padding page (see KVPool).
"""

from __future__ import annotations

import torch

import radixlm.envs as envs

# Freed pages are joined to the free list lazily: when the list's front runs short, or after
# this many frees (each join is a device op, and a verify step frees its rejected drafts).
JOIN_AFTER_FREES = 64


class KVAllocator:
    def __init__(self, num_slots: int, page_size: int, device: torch.device | str):
        if page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        if self.num_pages < 2:
            raise ValueError(f"KV pool of {num_slots} slots is too small for page size {page_size}")
        self.device = torch.device(device)
        # The double-free checks read the device, so they run on CUDA only with
        # RADIXLM_CHECK_INVARIANTS=1; the free-page map they read is kept only where they run
        # (two device ops fewer a decode step on the GPU).
        self.checks_frees = self.device.type != "cuda" or envs.check_invariants()
        self.clear()

    @property
    def total_size(self) -> int:
        """Usable token capacity (the padding page excluded)."""
        return (self.num_pages - 1) * self.page_size

    def clear(self) -> None:
        self._free_pages = torch.arange(1, self.num_pages, dtype=torch.int64, device=self.device)
        self._is_free = torch.ones(self.num_pages, dtype=torch.bool, device=self.device)
        self._is_free[0] = False
        # Pages given back since the last join, in order: the free list is _free_pages then
        # these, so pages are handed out in the same order as if each free had joined at once.
        self._freed: list[torch.Tensor] = []
        self._num_freed = 0

    def available_size(self) -> int:
        return (int(self._free_pages.numel()) + self._num_freed) * self.page_size

    def free_pages(self) -> torch.Tensor:
        """The free list, in the order pages are handed out."""
        self._join_freed()
        return self._free_pages

    def _join_freed(self) -> None:
        if self._freed:
            self._free_pages = torch.cat([self._free_pages, *self._freed])
            self._freed, self._num_freed = [], 0

    def _take_pages(self, n: int) -> torch.Tensor | None:
        if n > self._free_pages.numel():
            self._join_freed()
            if n > self._free_pages.numel():
                return None
        pages, self._free_pages = self._free_pages[:n], self._free_pages[n:]
        if self.checks_frees:
            self._is_free.index_fill_(0, pages, False)  # a Python-scalar index_put would sync
        return pages

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Fresh slots for `num_tokens` tokens starting on a page boundary (None when out of
        memory)."""
        if num_tokens < 0:
            # A negative count would slice the free list from the end and silently hand out
            # almost every page; a scheduler arithmetic slip must fail loudly instead.
            raise ValueError(f"alloc of {num_tokens} tokens")
        pages = self._take_pages(-(-num_tokens // self.page_size))
        if pages is None or self.page_size == 1:   # (single-token pages are their slots)
            return pages
        return self._pages_to_slots(pages)[:num_tokens]

    def alloc_extend(self, seq_len: int, last_loc: int, num_tokens: int) -> torch.Tensor | None:
        """Slots for `num_tokens` tokens appended to a request that already holds `seq_len`
        tokens, the last in slot `last_loc`: first the rest of its partly filled last page, then
        new pages."""
        if self.page_size == 1 or seq_len == 0:
            return self.alloc(num_tokens)
        if num_tokens < 0:
            raise ValueError(f"alloc_extend of {num_tokens} tokens")
        last_loc = int(last_loc)
        # Slot offset within its page always equals the token's position within its page (alloc
        # starts on a page boundary, tree pages are whole). A last_loc breaking that (e.g. -1 for
        # a non-empty request) would make `head` reach into a page owned by someone else or the
        # padding page, silently corrupting KV; refuse it.
        if last_loc < self.page_size or (last_loc + 1) % self.page_size != seq_len % self.page_size:
            raise ValueError(f"last_loc {last_loc} does not end a request of {seq_len} tokens")
        in_last_page = min((-seq_len) % self.page_size, num_tokens)
        head = torch.arange(last_loc + 1, last_loc + 1 + in_last_page, dtype=torch.int64,
                            device=self.device)
        rest = num_tokens - in_last_page
        if rest == 0:
            return head
        tail = self.alloc(rest)
        return None if tail is None else torch.cat([head, tail])

    def pages_needed(self, seq_len: int, num_tokens: int) -> int:
        """How many new pages alloc_extend(seq_len, ..., num_tokens) will take."""
        ps = self.page_size
        return -(-(seq_len + num_tokens) // ps) - (-(-seq_len // ps))

    def free(self, slots: torch.Tensor) -> None:
        """Give back the pages of `slots`. Callers free whole pages, or a request's tail that
        starts on a page boundary, in slot order, so every page's first slot sits at a multiple
        of page_size in the tensor; no device value is read (freeing happens while the overlap
        scheduler's next step runs). The double-free checks do read the device: they run on
        CUDA only with RADIXLM_CHECK_INVARIANTS=1."""
        if slots.numel() == 0:
            return
        slots = slots.to(device=self.device, dtype=torch.int64)
        pages = slots if self.page_size == 1 else slots[::self.page_size] // self.page_size
        if self.checks_frees:
            self._check_free(slots, pages)
            self._is_free.index_fill_(0, pages, True)
        self._freed.append(pages)
        self._num_freed += pages.numel()
        if len(self._freed) >= JOIN_AFTER_FREES:
            self._join_freed()

    def _check_free(self, slots: torch.Tensor, pages: torch.Tensor) -> None:
        if not torch.equal(torch.unique(pages), torch.unique(slots // self.page_size)):
            raise RuntimeError("freed slots do not start their pages: accounting bug")
        if bool(self._is_free[pages].any()) or bool((pages == 0).any()):
            raise RuntimeError("KV page freed twice (or the padding page freed): accounting bug")

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)
