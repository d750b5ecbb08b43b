"""ScheduleBatch: the scheduler's (CPU-side, mutable) view of one step, and its conversion to
the frozen device-side ForwardBatch.

Preparing a batch is where KV slots are handed out: every new token gets a slot, written into
the request's row of the req_to_token table, evicting from the radix cache when the allocator
runs dry. Admission (prefill.py) and retraction (decode.py) make sure that eviction suffices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.model_executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.model_executor.model_runner import ModelRunner
from radixlm.scheduler.request import Req


class OutOfKVMemory(RuntimeError):
    pass


def alloc_kv(runner: ModelRunner, tree_cache, req: Req, num_tokens: int) -> torch.Tensor:
    """Slots for the next num_tokens tokens of req (after its kv_committed_len tokens)."""
    alloc = runner.allocator
    row = runner.req_to_token_pool.req_to_token[req.req_pool_idx]
    kv = req.kv_committed_len
    last_loc = int(row[kv - 1]) if kv > 0 else -1
    locs = alloc.alloc_extend(kv, last_loc, num_tokens)
    if locs is None:
        short = alloc.pages_needed(kv, num_tokens) * alloc.page_size - alloc.available_size()
        tree_cache.evict(short)
        locs = alloc.alloc_extend(kv, last_loc, num_tokens)
    if locs is None:
        raise OutOfKVMemory(f"no KV memory for {num_tokens} tokens of request {req.rid}")
    return locs


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    def prepare_extend(self, runner: ModelRunner, tree_cache) -> ForwardBatch:
        """Each request computes fill_ids[kv_committed_len : kv_committed_len + extend_input_len]
        on top of its cached prefix (already in its req_to_token row)."""
        pool = runner.req_to_token_pool
        input_ids, positions, locs, logprob_rows = [], [], [], []
        prefix_lens, extend_lens, seq_lens = [], [], []
        for req in self.reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = pool.alloc()
                assert req.req_pool_idx is not None, "admission let in more requests than slots"
                pool.write(req.req_pool_idx, 0, req.prefix_indices)
                req.kv_committed_len = req.prefix_len
            start, n = req.kv_committed_len, req.extend_input_len
            new_locs = alloc_kv(runner, tree_cache, req, n)
            pool.write(req.req_pool_idx, start, new_locs)
            locs.append(new_locs)
            input_ids.extend(req.fill_ids[start:start + n])
            positions.extend(range(start, start + n))
            prefix_lens.append(start)
            extend_lens.append(n)
            seq_lens.append(start + n)
            logprob_rows.append(_input_logprob_rows(req, start, n))
        return self._to_forward_batch(runner, ForwardMode.EXTEND, input_ids, positions,
                                      torch.cat(locs), prefix_lens, extend_lens, seq_lens,
                                      logprob_rows if any(logprob_rows) else [])

    def prepare_decode(self, runner: ModelRunner, tree_cache) -> ForwardBatch:
        """Each request feeds its last output token at position seq_len - 1."""
        pool = runner.req_to_token_pool
        input_ids, positions, locs, seq_lens = [], [], [], []
        for req in self.reqs:
            pos = req.seq_len - 1
            assert req.kv_committed_len == pos, "decode request out of step with its KV"
            new_loc = alloc_kv(runner, tree_cache, req, 1)
            pool.write(req.req_pool_idx, pos, new_loc)
            locs.append(new_loc)
            input_ids.append(req.output_ids[-1])
            positions.append(pos)
            seq_lens.append(pos + 1)
        bs = len(self.reqs)
        return self._to_forward_batch(runner, ForwardMode.DECODE, input_ids, positions,
                                      torch.cat(locs), [s - 1 for s in seq_lens], [1] * bs,
                                      seq_lens, [])

    def _to_forward_batch(self, runner: ModelRunner, mode: ForwardMode, input_ids: list[int],
                          positions: list[int], out_cache_loc: torch.Tensor,
                          prefix_lens: list[int], extend_lens: list[int], seq_lens: list[int],
                          logprob_rows: list[list[int]]) -> ForwardBatch:
        dev = runner.device
        return ForwardBatch(
            forward_mode=mode, batch_size=len(self.reqs),
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            out_cache_loc=out_cache_loc.to(dev),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in self.reqs], dtype=torch.int64,
                                          device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=extend_lens, req_to_token_pool=runner.req_to_token_pool,
            kv_pool=runner.kv_pool, attn_backend=runner.attn_backend,
            input_logprob_rows=logprob_rows)


def _input_logprob_rows(req: Req, start: int, n: int) -> list[int]:
    """Rows of this chunk whose next-token distribution scores a prompt token in the requested
    range: row q (absolute position start + q) predicts prompt token start + q + 1."""
    if not req.wants_input_logprobs:
        return []
    first_target = max(req.effective_logprob_start, 1)
    return [q for q in range(n) if first_target <= start + q + 1 < req.prompt_len]


def input_logprob_targets(req: Req, start: int, rows: list[int]) -> list[int]:
    return [req.origin_input_ids[start + q + 1] for q in rows]
