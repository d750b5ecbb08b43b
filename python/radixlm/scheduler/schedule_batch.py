"""ScheduleBatch: the scheduler's (CPU-side, mutable) view of one step, and its conversion to
the frozen device-side ForwardBatch.

Preparing a batch is where KV slots are handed out (by the KVCacheManager): every new token
gets a slot, written into the request's row of the req_to_token table, evicting from the radix
cache when the allocator runs dry. Admission (prefill.py) and retraction (decode.py) make sure
that eviction suffices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from radixlm.core.forward_batch import ForwardBatch, ForwardMode
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.scheduler.request import Req
from radixlm.speculative.ngram import tree_ancestor_bits, tree_depths
from radixlm.utils.device import to_device


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    # Decode with jump-forward rows: each request's last row in the ForwardBatch (device), set by
    # prepare_decode; None when every request has one row (row i is request i). Sampling then
    # reads the logits of sample_rows() out of these.
    last_rows: torch.Tensor | None = None
    # Decode with speculative drafts: request index -> (its first row, rows), every row of which
    # is verified (scheduler/speculation.py); such requests do not go through the sampler.
    verify_rows: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Their drafts and tree parents (None: a chain) as verified: the request's own fields may
    # hold the next step's by the time this one is processed (pipelined verify steps).
    verify_drafts: dict[int, tuple[list[int], list[int] | None]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    def sample_rows(self) -> list[int]:
        """The rows that produce a token this step: in decode, all but a jump whose forced
        tokens did not all fit this step; in extend, not a prefill chunk mid-prompt, and not
        max_new_tokens == 0 (which only fills the cache). Called after the batch was prepared,
        when kv_allocated_len already counts this step's tokens."""
        if self.forward_mode.is_decode:
            return [i for i, r in enumerate(self.reqs)
                    if not r.input_on_host and i not in self.verify_rows]
        return [i for i, r in enumerate(self.reqs)
                if r.kv_allocated_len >= r.seq_len and r.max_new_tokens > 0]

    def input_logprob_targets(self, fb: ForwardBatch
                              ) -> tuple[list[list[int]], list[int], list[list[int] | None]]:
        """For prompt logprobs: each row's target tokens, top-k and the token ids it reports
        (`token_ids_logprob`); empty lists when none asks."""
        if not fb.input_logprob_rows:
            return [], [], []
        targets = [input_logprob_targets(r, fb.extend_prefix_lens_cpu[i],
                                         fb.input_logprob_rows[i])
                   for i, r in enumerate(self.reqs)]
        return (targets, [r.top_logprobs_num for r in self.reqs],
                [r.token_ids_logprob for r in self.reqs])

    def prepare_extend(self, kv: KVCacheManager, device: torch.device) -> ForwardBatch:
        """Each request computes fill_ids[kv_allocated_len : kv_allocated_len + extend_input_len]
        on top of its cached prefix (already in its req_to_token row). kv_allocated_len advances
        here, at launch: the slots are taken and the step will fill them."""
        pool = kv.req_to_token_pool
        input_ids, positions, locs, logprob_rows = [], [], [], []
        prefix_lens, extend_lens, seq_lens = [], [], []
        for req in self.reqs:
            if req.req_pool_idx is None:
                claim_pool_row(req, kv)
            start, n = req.kv_allocated_len, req.extend_input_len
            new_locs = kv.alloc_extend(req.req_pool_idx, start, n, f"request {req.rid}")
            pool.write(req.req_pool_idx, start, new_locs)
            locs.append(new_locs)
            input_ids.extend(req.fill_ids[start:start + n])
            positions.extend(range(start, start + n))
            prefix_lens.append(start)
            extend_lens.append(n)
            seq_lens.append(start + n)
            logprob_rows.append(_input_logprob_rows(req, start, n))
            req.kv_allocated_len = start + n
        dev = device
        packed = to_device(input_ids + positions + [r.req_pool_idx for r in self.reqs] + seq_lens,
                           torch.int64, dev)
        t, bs = len(input_ids), len(self.reqs)
        return self._forward_batch(ForwardMode.EXTEND, packed[:t], packed[t:2 * t],
                                   torch.cat(locs).to(dev), packed[2 * t:2 * t + bs],
                                   packed[2 * t + bs:], prefix_lens, extend_lens, seq_lens,
                                   logprob_rows if any(logprob_rows) else [])

    def prepare_decode(self, kv: KVCacheManager, last_token_ids: torch.Tensor,
                       max_rows: int | None = None) -> ForwardBatch:
        """Each request feeds its last sampled token at position kv_allocated_len. The token is
        read on the device from `last_token_ids` (the model runner's, written when it samples),
        so the batch can be built while the step that samples it is still running (overlap
        scheduler).

        A request that jumped forward (`input_on_host`) feeds its forced tokens instead, one
        row each, from the host (one with speculative drafts feeds them after its token, every
        row verified: `verify_rows`): the step stays a decode step (one CUDA graph, no extend
        pass), each row attending to the request's KV up to its own position. `last_rows` then names
        each request's last row, whose logits sample its next token. At most `max_rows` rows
        (the largest CUDA graph) when the requests fit: forced tokens past that wait for the
        next step, and their request samples only once all of them are computed."""
        self.last_rows = None
        self.verify_rows, self.verify_drafts = {}, {}
        if not any(r.input_on_host or r.spec_drafts for r in self.reqs):
            return self._prepare_one_row_each(kv, last_token_ids)
        pool = kv.req_to_token_pool
        spare = None if max_rows is None else max(max_rows - len(self.reqs), 0)
        rows_req, positions, starts, host_rows, host_ids, last_rows = [], [], [], [], [], []
        # Trees of drafts: each row's position in the text (its depth under the request's last
        # token), and which rows of its tree it sees; None while no request has a tree.
        tree: _TreeRows | None = None
        for i, req in enumerate(self.reqs):
            start, n = req.kv_allocated_len, req.num_decode_tokens
            assert n >= 1 and (req.input_on_host or n == 1 + len(req.spec_drafts)), \
                "decode request out of step with its KV"
            if req.spec_parents is not None and tree is None:
                tree = _TreeRows.for_rows_before(positions)
            if req.spec_drafts:
                # Row 0 feeds the last sampled token (on the device), rows 1.. the drafts.
                self.verify_rows[i] = (len(positions), n)
                self.verify_drafts[i] = (req.spec_drafts, req.spec_parents)
                host_rows.extend(range(len(positions) + 1, len(positions) + n))
                host_ids.extend(req.spec_drafts)
            elif req.input_on_host:
                if spare is not None:
                    extra = min(n - 1, spare)
                    spare -= extra
                    n = 1 + extra
                host_rows.extend(range(len(positions), len(positions) + n))
                host_ids.extend(req.fill_ids[start:start + n])
                req.input_on_host = start + n < req.seq_len   # forced tokens left for later
            if tree is not None:
                tree.add(start, n, req.spec_parents)     # (None unless it drafted a tree)
            rows_req.extend([req.req_pool_idx] * n)
            positions.extend(range(start, start + n))
            starts.extend([start] * n)
            last_rows.append(len(positions) - 1)
            req.kv_allocated_len = start + n
        rows, dev = len(positions), last_token_ids.device
        # Row r's token goes to KV position positions[r] (a tree's nodes in node order) and
        # sees the positions before it (a tree's rows: through tree_start / tree_mask).
        seq_lens = [p + 1 for p in positions]
        h = len(host_rows)
        extra = tree.depth_positions + tree.starts + tree.masks if tree is not None else []
        packed = to_device(rows_req + positions + seq_lens + pool.flat_index(rows_req, positions)
                           + host_rows + host_ids + last_rows + extra, torch.int64, dev)
        req_idx, pos_t, seq_t, flat_t, host_rows_t, host_ids_t, self.last_rows, *tree_t = (
            packed.split([rows] * 4 + [h, h, len(last_rows)] + [rows] * (len(extra) // rows)))
        locs = kv.alloc_decode(req_idx, pos_t, positions, starts)
        pool.write_flat(flat_t, locs)
        input_ids = last_token_ids[req_idx]
        if h:
            input_ids[host_rows_t] = host_ids_t
        fb = self._forward_batch(ForwardMode.DECODE, input_ids, pos_t, locs, req_idx, seq_t,
                                 positions, [1] * rows, seq_lens, [], rows)
        if tree is None:
            return fb
        rope, tree_start, tree_mask = tree_t
        return dataclasses.replace(fb, positions=rope, tree_start=tree_start,
                                   tree_mask=tree_mask)

    def _prepare_one_row_each(self, kv: KVCacheManager,
                              last_token_ids: torch.Tensor) -> ForwardBatch:
        """The common case, kept apart from the jump rows' path because it runs every step: no
        per-row lists, no host tokens, row i is request i."""
        pool = kv.req_to_token_pool
        positions = [req.kv_allocated_len for req in self.reqs]
        for req in self.reqs:
            assert req.num_decode_tokens == 1, "decode request out of step with its KV"
        bs, dev = len(self.reqs), last_token_ids.device
        seq_lens = [p + 1 for p in positions]
        pool_rows = [r.req_pool_idx for r in self.reqs]
        packed = to_device(pool_rows + positions + seq_lens + pool.flat_index(pool_rows, positions),
                           torch.int64, dev)
        req_idx, pos_t, seq_t, flat_t = packed.split(bs)
        locs = kv.alloc_decode(req_idx, pos_t, positions)
        pool.write_flat(flat_t, locs)
        for req, pos in zip(self.reqs, positions):
            req.kv_allocated_len = pos + 1
        return self._forward_batch(ForwardMode.DECODE, last_token_ids[req_idx],
                                   pos_t, locs, req_idx, seq_t, positions, [1] * bs, seq_lens, [])

    def _forward_batch(self, mode: ForwardMode, input_ids: torch.Tensor,
                       positions: torch.Tensor, out_cache_loc: torch.Tensor,
                       req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       prefix_lens: list[int], extend_lens: list[int], seq_lens_cpu: list[int],
                       logprob_rows: list[list[int]], rows: int | None = None) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=mode, batch_size=rows or len(self.reqs), input_ids=input_ids,
            positions=positions, out_cache_loc=out_cache_loc, req_pool_indices=req_pool_indices,
            seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu, extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=extend_lens, input_logprob_rows=logprob_rows)


@dataclass
class _TreeRows:
    """The per-row inputs of a decode step whose drafts include a tree (ForwardBatch.tree_start
    / tree_mask): a tree's node j sits at KV position start + j, is fed at text position
    start + its depth, and sees its ancestors' positions only. Other rows: text position = KV
    position, nothing masked."""
    depth_positions: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    masks: list[int] = field(default_factory=list)

    @classmethod
    def for_rows_before(cls, positions: list[int]) -> "_TreeRows":
        """Started once some rows are laid out already (none of them in a tree)."""
        return cls(list(positions), [p + 1 for p in positions], [0] * len(positions))

    def add(self, start: int, n: int, parents: list[int] | None) -> None:
        if parents is None:
            self.depth_positions.extend(range(start, start + n))
            self.starts.extend(range(start + 1, start + n + 1))
            self.masks.extend([0] * n)
            return
        self.depth_positions.extend(start + d for d in tree_depths(parents))
        self.starts.extend([start] * n)
        self.masks.extend(tree_ancestor_bits(parents))


def claim_pool_row(req: Req, kv: KVCacheManager) -> None:
    """Give a newly admitted request its req_to_token row, holding its cached prefix."""
    pool = kv.req_to_token_pool
    req.req_pool_idx = pool.alloc()
    assert req.req_pool_idx is not None, "admission let in more requests than slots"
    pool.write(req.req_pool_idx, 0, req.prefix_indices)
    req.kv_allocated_len = req.prefix_len


def _input_logprob_rows(req: Req, start: int, n: int) -> list[int]:
    """Rows of this chunk whose next-token distribution scores a prompt token in the requested
    range: row q (absolute position start + q) predicts prompt token start + q + 1."""
    if not req.wants_input_logprobs:
        return []
    first_target = max(req.effective_logprob_start, 1)
    return [q for q in range(n) if first_target <= start + q + 1 < req.prompt_len]


def input_logprob_targets(req: Req, start: int, rows: list[int]) -> list[int]:
    return [req.origin_input_ids[start + q + 1] for q in rows]
