"""Speculative decoding in the scheduler: which requests draft, how many tokens, and what a
verify step accepts (issue 18; drafter: speculative/ngram.py).

A decode step verifies a request's drafts d1..dk by feeding [last token, d1, ..., dk] as k+1
rows (ScheduleBatch.prepare_decode: the same decode step and CUDA graph as jump-forward's
forced tokens). Row j's logits predict the token after d_j, so with greedy sampling the target
would have produced d1..da (the longest run where row j-1's argmax equals d_j) followed by row
a's argmax: those a + 1 tokens are accepted, the KV of the rows after d_a is released, and the
last token becomes the next step's input. The output is the one decoding without drafts gives.

Which requests draft (`eligible`): greedy, with no logit bias, penalties, min_new_tokens,
grammar or logprobs (their sampling differs per row; they decode one token a step as before).
Policy: no drafts while more than `max_batch` requests run (a large batch is compute-bound, a
verify row costs as much as a real one); a request whose drafts keep being rejected (accept-rate
average below `MIN_ACCEPT_RATE`), or whose text offers no match `MAX_MISSES` times in a row,
stops drafting for `COOLDOWN_STEPS` steps (its steps overlap host and GPU work again). Drafts never exceed
the tokens the request may still produce, the context, the largest CUDA graph or free KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.scheduler.decode import decode_tokens_needed
from radixlm.scheduler.request import Req
from radixlm.speculative.ngram import NgramIndex

MIN_ACCEPT_RATE = 0.15      # below this running average of accepted / proposed, pause drafting
COOLDOWN_STEPS = 16
MAX_MISSES = 4              # proposals in a row that found no match before a pause
EMA_WEIGHT = 0.3            # weight of the newest verify step in the running average
DEFAULT_MAX_BATCH = 8       # requests running beyond which no request drafts


@dataclass
class SpecTotals:
    """Verify steps, draft tokens proposed and accepted, since start (stats and /metrics)."""
    verify_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0          # tokens verify steps produced (accepted drafts + one each)

    @property
    def accept_length(self) -> float:
        """Tokens per verify step (1.0: drafts never help)."""
        return self.emitted / self.verify_steps if self.verify_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_stats(self) -> dict[str, float]:
        """SchedulerStats' speculative fields (none before the first verify step)."""
        if not self.verify_steps:
            return {}
        return dict(spec_accept_length=self.accept_length,
                    spec_accept_rate=self.acceptance_rate, spec_verify_steps=self.verify_steps)


class NgramSpeculator:
    def __init__(self, num_draft_tokens: int, min_window: int, max_window: int,
                 max_batch: int = DEFAULT_MAX_BATCH):
        self.k = num_draft_tokens
        self.min_window, self.max_window = min_window, max_window
        self.max_batch = max_batch
        self.totals = SpecTotals()

    @staticmethod
    def eligible(req: Req) -> bool:
        p = req.sampling_params
        return (p.is_greedy and not p.logit_bias and not req.logit_adjustments_read_output
                and req.grammar is None and not req.return_logprob and not req.input_on_host)

    def may_draft(self, reqs: list[Req]) -> bool:
        """Whether the next decode step may carry drafts (the scheduler then processes the
        pending step first: drafts are read from the text the host has seen)."""
        return (len(reqs) <= self.max_batch
                and any(self.eligible(r) and r.spec_cooldown == 0 for r in reqs))

    def plan_step(self, reqs: list[Req], kv: KVCacheManager, max_rows: int | None,
                  context_len: int) -> None:
        """Drafts for the decode step about to be built, within the KV room left after every
        request's own next token (none rather than a retraction)."""
        ps = kv.page_size
        free = kv.available_size() - decode_tokens_needed(reqs, ps) - ps
        planned = self.plan(reqs, max(free, 0), max_rows, context_len)
        if planned and decode_tokens_needed(reqs, ps) > kv.available_size():
            for r in reqs:      # rounding to pages: the drafts did not fit after all
                r.spec_drafts = []

    def plan(self, reqs: list[Req], free_tokens: int, max_rows: int | None,
             context_len: int) -> int:
        """Set each request's spec_drafts for the next decode step; returns how many draft
        tokens in all. `free_tokens`: KV slots left after every request's own next token."""
        for r in reqs:
            r.spec_drafts = []
        if len(reqs) > self.max_batch:
            return 0
        rows_left = (max_rows - len(reqs)) if max_rows is not None else 1 << 30
        budget, total = min(free_tokens, rows_left), 0
        for req in reqs:
            # (A token still in flight: the drafter would not see it; the scheduler processes
            # pending steps first whenever `may_draft`.)
            if not self.eligible(req) or req.num_pending:
                continue
            if req.spec_cooldown > 0:
                req.spec_cooldown -= 1
                continue
            k = min(self.k, req.remaining_new_tokens - 1, context_len - req.seq_len - 1,
                    budget)
            if k <= 0:
                continue
            if req.spec_index is None:
                req.spec_index = NgramIndex(self.min_window, self.max_window)
            req.spec_drafts = req.spec_index.propose(req.fill_ids, k)
            # Text that does not repeat itself gets no drafts, yet each step it might costs
            # the overlap of host and GPU work: after a few misses in a row, pause as well.
            req.spec_misses = 0 if req.spec_drafts else req.spec_misses + 1
            if req.spec_misses >= MAX_MISSES:
                req.spec_misses, req.spec_cooldown = 0, COOLDOWN_STEPS
            budget -= len(req.spec_drafts)
            total += len(req.spec_drafts)
        return total

    def accept(self, req: Req, targets: list[int]) -> list[int]:
        """The tokens a verify step gives `req`: its drafts up to the first that differs from
        the target's choice, then the target's token there. `targets[j]`: row j's argmax."""
        drafts, req.spec_drafts = req.spec_drafts, []
        assert len(targets) == len(drafts) + 1, "one verify row per draft, plus the input"
        a = 0
        while a < len(drafts) and targets[a] == drafts[a]:
            a += 1
        req.spec_verify_ct += 1
        rate = a / len(drafts)
        req.spec_accept_avg = (1 - EMA_WEIGHT) * req.spec_accept_avg + EMA_WEIGHT * rate
        if req.spec_accept_avg < MIN_ACCEPT_RATE:
            req.spec_cooldown = COOLDOWN_STEPS
            req.spec_accept_avg = 0.5       # a fresh chance after the pause
        t = self.totals
        t.verify_steps += 1
        t.proposed += len(drafts)
        t.accepted += a
        t.emitted += a + 1
        return drafts[:a] + [targets[a]]
