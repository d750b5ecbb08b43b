"""Admission: which waiting requests join the next prefill batch, and how much of each.

The KV budget is what is free plus what the radix cache could evict, minus a reservation for the
tokens that running requests will still generate. The reservation multiplies their remaining
max_new_tokens by new_token_ratio, which starts high, decays while decoding goes well and jumps
back up after a retraction (decode.py).
"""

from __future__ import annotations

import enum

from radixlm.mem_cache.prefix_cache import LoadPeek
from radixlm.scheduler.request import Req

# A request promising 100k new tokens should not block admission as if it will use them all.
RESERVE_CLIP = 4096
# In-batch prefix sharing: a request whose first this-many tokens equal those of a request
# admitted in the same batch, and that finds less than that in the cache, waits one step; it
# then reads the shared prefix from the radix cache instead of computing it a second time.
SHARED_PREFIX_TOKENS = 32


class AddResult(enum.Enum):
    ADDED = "added"
    CHUNKED = "chunked"        # admitted with part of its prompt; stop adding
    NO_ROOM = "no_room"        # stop adding
    DEFERRED = "deferred"      # shares an uncached prefix with a request in this batch; next step


def reserved_tokens(req: Req, new_token_ratio: float) -> int:
    return int(min(req.remaining_new_tokens, RESERVE_CLIP) * new_token_ratio)


class PrefillAdder:
    def __init__(self, prefix_cache, allocator, running: list[Req], new_token_ratio: float,
                 max_prefill_tokens: int, chunked_prefill_size: int | None,
                 free_req_slots: int, share_prefixes: bool = True):
        self.prefix_cache = prefix_cache
        self.page_size = allocator.page_size
        self.ratio = new_token_ratio
        self.rem_total = (allocator.available_size() + prefix_cache.evictable_size()
                          - sum(reserved_tokens(r, new_token_ratio) for r in running))
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunked_prefill_size if chunked_prefill_size else None
        self.free_req_slots = free_req_slots
        self.nothing_running = not running
        self.added: list[Req] = []
        self.share_prefixes = share_prefixes
        self._batch_prefixes: set[tuple[int, ...]] = set()

    def _budget(self) -> int | None:
        """How many prompt tokens one more request may compute this step (None: unlimited)."""
        if self.rem_chunk is None:
            return None
        return min(self.rem_chunk, self.rem_input)

    def add_chunked(self, req: Req) -> AddResult:
        """Continue a request whose prefill was chunked; its KV so far is its prefix."""
        n = req.remaining_prefill
        budget = self._budget()
        if budget is not None and n > budget:
            n = self._page_floor(budget) or budget
        req.extend_input_len = n
        self._take(req, n)
        return AddResult.CHUNKED if n < req.remaining_prefill else AddResult.ADDED

    def add(self, req: Req) -> AddResult:
        if self.free_req_slots <= 0:
            return AddResult.NO_ROOM
        budget = self._budget()
        if budget is not None and budget <= 0:    # before matching: a match may load KV
            return AddResult.NO_ROOM
        key = req.fill_ids[:req.max_prefix_match()]
        peek = self.prefix_cache.peek_load(key)
        if peek is not None and peek.to_load and not self._room_to_load(req, peek):
            return AddResult.NO_ROOM
        match = self.prefix_cache.match_prefix(key)
        head = tuple(req.fill_ids[:SHARED_PREFIX_TOKENS])
        if (self.share_prefixes and len(head) == SHARED_PREFIX_TOKENS
                and len(match.indices) < SHARED_PREFIX_TOKENS):
            if head in self._batch_prefixes:
                return AddResult.DEFERRED
            self._batch_prefixes.add(head)
        extend = req.seq_len - len(match.indices)
        if not self._fits(req, extend):
            return AddResult.NO_ROOM
        first = not self.added
        if not first and extend > self.rem_input:
            return AddResult.NO_ROOM
        evictable_before = self.prefix_cache.evictable_size()
        self.prefix_cache.inc_lock_ref(match.last_node)
        # Locking turned some evictable tokens into protected ones: they are no longer budget.
        locked = evictable_before - self.prefix_cache.evictable_size()
        self.rem_total -= locked
        if not self._fits(req, extend):
            # The budget counted this request's own cached prefix as evictable; locked, it is
            # not, and what is left cannot hold the new tokens.
            self.prefix_cache.dec_lock_ref(match.last_node)
            self.rem_total += locked
            return AddResult.NO_ROOM
        req.prefix_indices = match.indices
        req.last_node = match.last_node
        if req.num_retractions == 0 and not req.output_ids:
            req.cached_tokens = len(match.indices)
        self.free_req_slots -= 1
        if budget is not None and extend > budget:
            req.extend_input_len = self._page_floor(budget) or budget
            self._take(req, req.extend_input_len)
            return AddResult.CHUNKED
        req.extend_input_len = extend
        self._take(req, extend)
        return AddResult.ADDED

    def _room_to_load(self, req: Req, peek: LoadPeek) -> bool:
        """Whether a request whose cached prefix is partly on the host tier would be admitted,
        judged before matching: matching copies that part into device slots (evicting other
        prefixes for room), which is wasted, and thrashes the device cache when repeated every
        step, for a request that then does not fit. The same test as after the match: the
        budget loses what locking the prefix protects (its unlocked device part and the
        loaded part, whole pages), and what is left must hold the new tokens."""
        extend = req.seq_len - peek.cached
        if self.added and extend > self.rem_input:
            return False
        return self._fits(req, extend + peek.unlocked_on_device + peek.to_load)

    def _fits(self, req: Req, extend: int) -> bool:
        """Whether `extend` new tokens (whole pages) and the request's output reservation fit
        the budget. The first request of an idle engine needs room for its prompt only."""
        pages = self._pages(extend) + self.page_size
        if pages + reserved_tokens(req, self.ratio) <= self.rem_total:
            return True
        return not self.added and self.nothing_running and pages <= self.rem_total

    def _take(self, req: Req, n: int) -> None:
        self.added.append(req)
        # A new extend starts on a fresh page (cached prefixes are page aligned), so it takes
        # whole pages: charging tokens would admit more short requests than the pages hold.
        self.rem_total -= self._pages(n) + reserved_tokens(req, self.ratio)
        self.rem_input -= n
        if self.rem_chunk is not None:
            self.rem_chunk -= n

    def _page_floor(self, n: int) -> int:
        return n - n % self.page_size

    def _pages(self, n: int) -> int:
        """n tokens rounded up to whole pages."""
        return -(-n // self.page_size) * self.page_size
