"""Speculative decoding in the scheduler: which requests draft, how many tokens, and what a
verify step accepts (issue 18; drafter: speculative/ngram.py).

A decode step verifies a request's drafts d1..dk by feeding [last token, d1, ..., dk] as k+1
rows (ScheduleBatch.prepare_decode: the same decode step and CUDA graph as jump-forward's
forced tokens). Row j's logits predict the token after d_j, so with greedy sampling the target
would have produced d1..da (the longest run where row j-1's argmax equals d_j) followed by row
a's argmax: those a + 1 tokens are accepted, the KV of the rows after d_a is released, and the
last token becomes the next step's input. The output is the one decoding without drafts gives.

Sampled requests (temperature > 0, top-k / top-p / min-p) are verified the same way, with row
j's target being the token the sampler would draw at that output position (`verify_targets`):
the sampler's Gumbel noise is a function of (seed, position, token) (sampling/noise.py), so the
token a request gets at a position depends only on the logits there, and a draft is kept exactly
when sampling without drafts would have produced it. The output is then the one decoding without
drafts gives for the same seed, token for token, hence exactly the target's distribution, with no
rejection-sampling correction: for a deterministic draft, the chance that a draft token d is kept,
p(d), is what rejection sampling would accept it with. Logit bias, penalties and min_new_tokens
are exact too: row j is sampled as if d1..dj were already in the output (its penalty counts and
output length include them), which is what they would be had the drafts been decoded one by one.
Logprobs of the accepted tokens are those rows' logprobs (log_softmax of the raw logits at the
token), as decoding without drafts reports them.

Grammar requests draft too: their drafts are cut before the first token the grammar rejects
(`plan`), and row j's target is sampled under the grammar's mask after d1..dj (the matcher
accepts the drafts while the masks are filled, then rolls back; the accepted tokens advance it
when the step is processed). Which requests draft (`eligible`): all but one feeding
jump-forward tokens.
Trees (NGRAM with --speculative-ngram-max-bfs-breadth > 1, or a draft model with
--speculative-eagle-topk > 1, scheduler/draft_tree.py; speculative/ngram.DraftTree): the drafts
are nodes of a tree under the last token, one verify row each, in node order. Node j
writes its KV at position start + j but is fed at position start + its depth, and attends to
its ancestors only (ForwardBatch.tree_start / tree_mask, a bit per node). Row j's target is
sampled as if the tokens on its path were output; `accept_rows` walks from the root through the
child holding the target's token, and the accepted nodes' slots are renumbered to the positions
they take in the text (KVCacheManager.reorder_slots), the others released. Grammar requests
keep the tree's main chain.
Pipelined verify steps (RADIXLM_SPEC_PIPELINE=1; NGRAM chains, plain greedy requests, the
overlap scheduler; off by default, no faster in the benchmarks so far): a verify
step's drafts are read from the text, so the step after it would wait for its results (no
overlap of host and GPU work, about twice a plain step's time on a small model). Instead, the
drafter's continuation goes on past the drafts (`Req.spec_followup`, up to PIPELINE_LOOKAHEAD
steps' worth), and the next step is built before this one's results are read, on the guess
that it accepts every draft: the request's text in flight counts its rows (`spec_inflight`),
the device holds the target's token after its last draft as the next input (Scheduler.
_guess_inputs), and the next drafts come from the continuation after the guessed bonus token.
Where the step accepts fewer, the step built on the guess is dropped for that request (its KV
released, its rows stale through Req.kv_epoch, its input corrected) and the next step waits
for the text again; where it accepts all, the next step stands as built. Either way the tokens
are the target's: only positions were guessed, every token is verified.
Policy: no drafts while more than `max_batch` requests run (a large batch is compute-bound, a
verify row costs as much as a real one); otherwise a request drafts while its drafts pay for
the overlap of host and GPU work its steps give up, measured as the engine runs
(scheduler/spec_policy.py). Drafts never exceed the tokens the request may still produce, the
context, the largest CUDA graph or free KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

import radixlm.envs as envs
from radixlm.constrained.base import GrammarBackend, GrammarMatcher
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.sampling.batch_info import SamplingBatchInfo
from radixlm.sampling.params import SamplingParams
from radixlm.sampling.request import SamplingRequest
from radixlm.sampling.sampler import SampleOutput, Sampler
from radixlm.sampling.token_mask import TokenMask
from radixlm.scheduler.schedule_batch import ScheduleBatch
from radixlm.scheduler.decode import decode_tokens_needed
from radixlm.scheduler.request import Req
from radixlm.scheduler.spec_policy import EMA_WEIGHT, DraftPolicy
from radixlm.speculative.ngram import DraftTree, NgramIndex, weighted_tree

if TYPE_CHECKING:
    from radixlm.scheduler.config import SchedulerConfig

# A stand-in for the rows of a verify step that are no request's verify rows (their target is
# not read): greedy, nothing to build.
_UNREAD_ROW = SamplingRequest(SamplingParams(temperature=0.0), seed=0, prompt_ids=(),
                              output_ids=())

DEFAULT_MAX_BATCH = 8       # requests running beyond which no request drafts
PIPELINE_LOOKAHEAD = 16     # steps' worth of a chain's continuation kept for pipelined steps
# A step built on the guess that the one in flight accepts all its drafts saves the host's wait
# when it does and wastes a GPU step when it does not, about as long: a request is pipelined
# only while its verify steps accepted every draft at least this often (running average,
# envs.spec_pipeline_min_full_rate, 0.5).


@dataclass
class SpecTotals:
    """Verify steps, draft tokens proposed and accepted, since start (stats and /metrics)."""
    verify_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0          # tokens verify steps produced (accepted drafts + one each)
    pipelined: int = 0        # of a request's verify steps, built before the previous one's
    #                           results were read
    # (With draft trees `proposed` counts every node, siblings included, so the acceptance
    # rate is lower than a chain's for the same accept length.)

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
                    spec_accept_rate=self.acceptance_rate, spec_verify_steps=self.verify_steps,
                    spec_pipelined_steps=self.pipelined)


class Drafter(Protocol):
    """Proposes each request's drafts: up to ks[i] tokens to follow reqs[i]'s text, as a chain
    (a list) or a tree."""

    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int] | DraftTree]: ...


class NgramDrafter:
    """--speculative-algorithm NGRAM: the request's own text predicts itself (an incremental
    index per request, speculative/ngram.py). With max_breadth > 1 it proposes trees: the
    continuations of several earlier occurrences, merged (`weighted_tree`)."""

    def __init__(self, min_window: int, max_window: int, min_breadth: int = 1,
                 max_breadth: int = 1):
        self.min_window, self.max_window = min_window, max_window
        self.min_breadth, self.max_breadth = min_breadth, max_breadth

    @classmethod
    def from_config(cls, config: "SchedulerConfig") -> "NgramDrafter":
        return cls(config.speculative_ngram_min_match_window_size,
                   config.speculative_ngram_max_match_window_size,
                   config.speculative_ngram_min_bfs_breadth,
                   config.speculative_ngram_max_bfs_breadth)

    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int] | DraftTree]:
        drafts: list[list[int] | DraftTree] = []
        for req, k in zip(reqs, ks):
            if req.spec_index is None:
                req.spec_index = NgramIndex(self.min_window, self.max_window,
                                            occurrences=self.max_breadth)
            if self.max_breadth == 1 or req.grammar is not None:
                # (a grammar's masks follow one path: its whole budget goes to one chain)
                drafts.append(req.spec_index.propose(req.fill_ids, k))
                continue
            found = req.spec_index.candidates(req.fill_ids, k, 2 * self.max_breadth)
            drafts.append(weighted_tree(found, k, self.min_breadth, self.max_breadth))
        return drafts


class Speculator:
    """Which requests draft and how many tokens (the policy above), and what a verify step
    accepts; the drafts themselves come from the `drafter`."""

    def __init__(self, drafter: Drafter, num_draft_tokens: int,
                 max_batch: int = DEFAULT_MAX_BATCH):
        self.drafter = drafter
        self.k = num_draft_tokens
        self.max_batch = max_batch
        self.totals = SpecTotals()
        self.policy = DraftPolicy()
        # Pipelined verify steps (module docstring): chains of n-gram drafts only (a tree's
        # accepted path, a draft model's next drafts are not known ahead).
        chains = isinstance(drafter, NgramDrafter) and drafter.max_breadth == 1
        self.lookahead = (PIPELINE_LOOKAHEAD * (num_draft_tokens + 1)
                          if chains and envs.spec_pipeline() else 0)
        self.pipeline_min_full_rate = envs.spec_pipeline_min_full_rate()

    def stats(self) -> dict[str, float]:
        """SchedulerStats' speculative fields."""
        return {**self.totals.as_stats(), "spec_cost_ratio": self.policy.cost_ratio}

    @staticmethod
    def eligible(req: Req) -> bool:
        return not req.input_on_host

    def may_draft(self, reqs: list[Req]) -> bool:
        """Whether the next decode step may carry drafts (the scheduler then processes the
        pending step first: drafts are read from the text the host has seen)."""
        return (len(reqs) <= self.max_batch
                and self.policy.batch_pays(self._candidates(reqs), len(reqs)))

    def may_pipeline(self, pending: ScheduleBatch, running: list[Req]) -> bool:
        """Whether the next step may be built before the pending verify step's results are
        read: every request it verifies is plain greedy, drafted a chain, still running, and has
        a continuation left to draft from (the next step's rows assume all its drafts are
        accepted, and are dropped for a request where they are not)."""
        if not self.lookahead or len(running) > self.max_batch:
            return False
        live = {id(r) for r in running}
        for i in pending.verify_rows:
            r = pending.reqs[i]
            if (id(r) not in live or r.to_abort or pending.verify_drafts[i][1] is not None
                    or len(r.spec_followup) < 2 or not plain_greedy(r)
                    or r.spec_full_avg < self.pipeline_min_full_rate
                    or r.remaining_new_tokens - r.spec_inflight < 2):
                return False
        return True

    def _candidates(self, reqs: list[Req]) -> list[Req]:
        """The requests that would try to draft (not paused; a jump's forced tokens do not)."""
        return [r for r in reqs if self.eligible(r) and r.spec_cooldown == 0]

    def plan_step(self, reqs: list[Req], kv: KVCacheManager, max_rows: int | None,
                  context_len: int) -> None:
        """Drafts for the decode step about to be built, within the KV room left after every
        request's own next token (none rather than a retraction)."""
        ps = kv.page_size
        free = kv.available_size() - decode_tokens_needed(reqs, ps) - ps
        planned = self.plan(reqs, max(free, 0), max_rows, context_len)
        if planned and decode_tokens_needed(reqs, ps) > kv.available_size():
            for r in reqs:      # rounding to pages: the drafts did not fit after all
                r.spec_drafts, r.spec_parents, r.spec_followup = [], None, []

    def plan(self, reqs: list[Req], free_tokens: int, max_rows: int | None,
             context_len: int) -> int:
        """Set each request's spec_drafts for the next decode step; returns how many draft
        tokens in all. `free_tokens`: KV slots left after every request's own next token (a
        draft model also writes its drafts' KV there while it drafts)."""
        for r in reqs:
            r.spec_drafts, r.spec_parents = [], None
        if len(reqs) > self.max_batch:
            return 0
        # Rows the step has without drafts: one a request, every host-fed token of a jump or of
        # a short prompt (short_prefill.py); the drafts get what the largest graph has left.
        rows = len(reqs) + sum(r.num_decode_tokens - 1 for r in reqs if r.input_on_host)
        rows_left = (max_rows - rows) if max_rows is not None else 1 << 30
        budget = min(free_tokens, rows_left)
        # Decided before the pauses run down, as `may_draft` decided it.
        pays = self.policy.batch_pays(self._candidates(reqs), len(reqs))
        drafting, ks = [], []
        for req in reqs:
            # A pause counts every decode step, overlapped ones included: under the overlap
            # scheduler a paused request always has a token in flight here (`may_draft` lets
            # the step overlap), and a count behind that check would never run down.
            if req.spec_cooldown > 0:
                req.spec_cooldown -= 1
                continue
            # (A token still in flight: the drafter would not see it; the scheduler processes
            # pending steps first whenever `may_draft`.)
            if not self.eligible(req):
                continue
            if req.spec_inflight:       # a pipelined step: its verify step is in flight
                budget -= self._draft_followup(req, budget, context_len)
                continue
            if not self.policy.pays(req):   # (the measured ratio overtook its gain)
                self.policy.pause(req)
                continue
            if not pays or req.num_pending:
                continue
            k = min(self.k, req.remaining_new_tokens - 1, context_len - req.seq_len - 1,
                    budget)
            if k <= 0:
                continue
            drafting.append(req)
            ks.append(k)
            budget -= k
        total = sum(len(r.spec_drafts) for r in reqs)    # (pipelined steps' drafts)
        # A plain greedy request's chain goes on past its drafts: the steps after this one
        # may draft from it while this one runs (`may_pipeline`).
        longer = [k + (self.lookahead if plain_greedy(r) else 0) for r, k in zip(drafting, ks)]
        found = self.drafter.propose(drafting, longer) if drafting else []
        for req, k, drafts in zip(drafting, ks, found):
            if isinstance(drafts, list):
                drafts, req.spec_followup = drafts[:k], drafts[k:]
            if isinstance(drafts, DraftTree):
                if req.grammar is not None:     # (a drafter's tree: keep one path)
                    drafts = drafts.main_chain()
                if not drafts.is_chain:
                    req.spec_parents = drafts.parents
                drafts = drafts.tokens
            if req.grammar is not None:
                drafts = _grammar_prefix(req.grammar, drafts)
            req.spec_drafts = drafts
            if not drafts:  # (no match: the step waited for nothing, an attempt of 1 token)
                self.policy.after_attempt(req, 1)
            total += len(drafts)
        return total

    def _draft_followup(self, req: Req, budget: int, context_len: int) -> int:
        """Drafts for a request whose verify step is in flight, from the continuation its
        drafts came from: its first token is the guess for that step's bonus token (the next
        step's input, read on the device), the drafts follow it. Returns how many."""
        ahead = req.spec_inflight
        m = min(self.k, req.remaining_new_tokens - ahead - 1,
                context_len - req.seq_len - ahead - 1, budget, len(req.spec_followup) - 1)
        if m <= 0:
            req.spec_followup = []
            return 0
        req.spec_drafts = req.spec_followup[1:1 + m]
        req.spec_followup = req.spec_followup[1 + m:]
        self.totals.pipelined += 1
        return m

    def accept(self, req: Req, targets: list[int]) -> list[int]:
        """The tokens a verify step gives `req` (`accept_rows`)."""
        return self.accept_rows(req, targets)[0]

    def accept_rows(self, req: Req, targets: list[int],
                    drafted: tuple[list[int], list[int] | None] | None = None
                    ) -> tuple[list[int], list[int]]:
        """The tokens a verify step gives `req`: its drafts up to the first that differs from
        the target's choice, then the target's token there; and the rows whose targets they are
        (row 0, the input, then the accepted drafts' rows). `targets[j]`: the target's token
        after row j (`verify_targets`). A tree is walked from the root: at each node, the child
        holding the target's token there, if any. The caller says how many tokens it used
        (`record_used`)."""
        drafts, parents = drafted if drafted is not None else (req.spec_drafts,
                                                                req.spec_parents)
        if drafts is req.spec_drafts:   # (not a pipelined step's, planned since)
            req.spec_drafts, req.spec_parents = [], None
        assert len(targets) == len(drafts) + 1, "one verify row per draft, plus the input"
        if parents is None:     # a chain: node j is row j (this walk is on the critical path)
            n = 0
            while n < len(drafts) and drafts[n] == targets[n]:
                n += 1
            rows = list(range(n + 1))
        else:
            tree, rows = DraftTree(drafts, parents), [0]
            while True:
                node = rows[-1]
                nxt = next((j for j, p in enumerate(tree.parents, start=1)
                            if p == node and tree.tokens[j - 1] == targets[node]), None)
                if nxt is None:
                    break
                rows.append(nxt)
        req.spec_verify_ct += 1
        self.policy.after_attempt(req, len(rows))
        full = len(rows) == len(drafts) + 1
        req.spec_full_avg += EMA_WEIGHT * (full - req.spec_full_avg)
        self.totals.verify_steps += 1
        self.totals.proposed += len(drafts)
        return [drafts[j - 1] for j in rows[1:]] + [targets[rows[-1]]], rows

    def record_used(self, tokens: list[int], used: int) -> None:
        """Count the first `used` of the `tokens` accept() gave (a stop condition, a grammar's
        end or its jump-forward can drop the rest): the accepted drafts among them, and all."""
        self.totals.accepted += min(used, len(tokens) - 1)
        self.totals.emitted += used


def verify_targets(batch: ScheduleBatch, logits: torch.Tensor, sampler: Sampler,
                   eos_token_ids: Sequence[int],
                   grammar_backend: GrammarBackend | None = None) -> SampleOutput:
    """The target's token after each row of a verify step, with its logprob: the argmax for
    plain greedy requests, otherwise the token the sampler draws for that row's request at that
    row's output position, with the request's drafts before the row counted as output (and
    accepted by its grammar; see the module docstring). Rows of requests without drafts are not
    read (greedy stand-ins)."""
    owners = [batch.reqs[i] for i in batch.verify_rows]
    if all(plain_greedy(r) for r in owners):
        ids = logits.argmax(-1)
        return SampleOutput(ids, torch.zeros(ids.shape, dtype=torch.float32,
                                             device=ids.device))
    rows = [_UNREAD_ROW] * logits.shape[0]
    tops = [0] * logits.shape[0]
    asked: list[list[int] | None] = [None] * logits.shape[0]
    for i, (first, n) in batch.verify_rows.items():
        r = batch.reqs[i]
        tree = as_tree(r.spec_drafts, r.spec_parents)
        for j in range(n):
            rows[first + j] = sampling_after(r, tree.path_tokens(j), eos_token_ids)
            tops[first + j] = r.top_logprobs_num if r.return_logprob else 0
            asked[first + j] = r.token_ids_logprob
    info = SamplingBatchInfo.build(rows, logits.shape[1], logits.device)
    info.vocab_mask = _grammar_masks(batch, logits.shape[0], grammar_backend, logits.device)
    return sampler(logits, info, tops if any(tops) else None,
                   token_ids=asked if any(asked) else None)


def as_tree(drafts: list[int], parents: list[int] | None) -> DraftTree:
    """A request's drafts as a tree (`Req.spec_parents` None: a chain)."""
    return DraftTree(drafts, parents) if parents is not None else DraftTree.chain(drafts)


def sampling_after(req: Req, drafts: list[int], eos_token_ids: Sequence[int]) -> SamplingRequest:
    """How `req` samples the token after its output followed by `drafts`: as if they had been
    decoded one by one (penalty counts, min_new_tokens and the noise position include them)."""
    return SamplingRequest(req.sampling_params, req.seed, req.origin_input_ids,
                           req.output_ids + drafts, eos_token_ids, req.num_pending)


def plain_greedy(req: Req) -> bool:
    """Greedy with nothing that changes the logits or asks for logprobs: argmax alone."""
    p = req.sampling_params
    return (p.is_greedy and not p.logit_bias and not req.return_logprob and req.grammar is None
            and not req.logit_adjustments_read_output)


def _grammar_prefix(matcher: GrammarMatcher, drafts: list[int]) -> list[int]:
    """The drafts up to the first one the grammar would reject, or that ends it (the stop
    token: no mask follows it, so it is not drafted; the target's row before it may still pick
    it). The matcher is left as found."""
    accepted = kept = 0
    for token in drafts:
        if not matcher.accept_token(token):
            break
        accepted += 1
        if matcher.is_terminated():
            break
        kept += 1
    matcher.rollback(accepted)
    return drafts[:kept]


def _grammar_masks(batch: ScheduleBatch, num_rows: int, backend: GrammarBackend | None,
                   device: torch.device) -> TokenMask | None:
    """The verify rows' grammar masks: row j of a grammar request is filled in the state after
    its drafts d1..dj (accepted, then rolled back); other rows allow everything."""
    owners = [(i, batch.reqs[i].grammar) for i in batch.verify_rows
              if batch.reqs[i].grammar is not None]
    if not owners:
        return None
    assert backend is not None, "a grammar request without the grammar backend"
    mask = backend.allocate_mask(num_rows)
    for i, matcher in owners:
        first, n = batch.verify_rows[i]
        drafts = batch.reqs[i].spec_drafts
        for j in range(n):
            matcher.fill_vocab_mask(mask, first + j)
            if j < n - 1:
                accepted = matcher.accept_token(drafts[j])
                assert accepted, "drafts are cut before the grammar's first rejection"
        matcher.rollback(n - 1)
    return backend.on_device(mask, device)
