"""Req: one request as the scheduler sees it.

A request is a handful of lengths: its prompt, its output so far, how much of that has KV in the
pool (`kv_allocated_len`), how much came from the prefix cache, and what this step computes.
Everything else derives from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixlm.core.logprobs import TokenLogprob, TopLogprobs
from radixlm.managers.messages import FinishReason, TokenizedGenerateReq
from radixlm.sampling.params import SamplingParams

if TYPE_CHECKING:
    from concurrent.futures import Future

    from radixlm.constrained.base import GrammarMatcher
    from radixlm.managers.detokenizer import StopStringChecker
    from radixlm.mem_cache.radix_cache import TreeNode
    from radixlm.speculative.ngram import NgramIndex


@dataclass(eq=False)
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    arrival: int = 0                       # order of arrival (fcfs tie-breaks)
    token_ids_logprob: list[int] | None = None   # ids whose logprobs each position reports

    output_ids: list[int] = field(default_factory=list)
    finished_reason: FinishReason | None = None
    to_abort: bool = False

    # Memory
    req_pool_idx: int | None = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: "TreeNode | None" = None
    # Tokens of fill_ids that hold KV slots: advanced when a step is launched, so it counts the
    # tokens whose K/V that step is still writing (not "committed" to the pool yet).
    kv_allocated_len: int = 0
    extend_input_len: int = 0              # tokens computed by the current extend step
    # Tokens sampled by launched steps whose results the host has not processed yet (overlap
    # scheduler: at most 1). They are on the device in ModelRunner.last_token_ids.
    num_pending: int = 0
    kv_epoch: int = 0                      # bumped by reset_kv and jump_to
    # The tokens from kv_allocated_len on are known on the host only (a jump-forward replaced
    # them): the next decode step feeds them from the host, not from the sampler's output.
    input_on_host: bool = False

    # Speculative decoding (scheduler/speculation.py): the drafts the next decode step
    # verifies, the drafter's index of this request's text, and the policy's state.
    spec_drafts: list[int] = field(default_factory=list)
    # The drafts' tree: node j + 1 (spec_drafts[j]) hangs under node spec_parents[j], node 0
    # being the last sampled token (speculative/ngram.DraftTree); None: a chain.
    spec_parents: list[int] | None = None
    spec_index: "NgramIndex | None" = None
    spec_verify_ct: int = 0                # verify steps (SGLang's meta_info spec_verify_ct)
    # The adaptive policy (scheduler/spec_policy.py): tokens an attempt to draft gave, on
    # average (None: no attempt yet), the steps left in a pause, pauses in a row.
    spec_gain: float | None = None
    spec_cooldown: int = 0
    spec_pauses: int = 0
    # Pipelined verify steps (speculation.py): the drafter's continuation past the drafts in
    # flight (its first token: the guess for their bonus token), the tokens a launched,
    # unread verify step adds to the text if it accepts every draft (its rows), and how often
    # its verify steps accepted every draft (a running average; pipelining needs it high).
    spec_followup: list[int] = field(default_factory=list)
    spec_inflight: int = 0
    spec_full_avg: float = 0.5

    # Reporting
    cached_tokens: int = 0                 # prompt tokens that came from the prefix cache
    num_retractions: int = 0
    stop_checker: "StopStringChecker | None" = None
    prompt_counted: bool = False           # prompt tokens added to the cache-hit statistics

    # Structured outputs
    grammar_future: "Future | None" = None  # compiling; the request waits, others go on
    grammar: "GrammarMatcher | None" = None
    # Optimistic grammar sampling (scheduler/grammar_sampling.py): decode rows sample without
    # the mask while grammar_masked_steps is 0; a token the grammar rejects is sampled again
    # under the mask, and the request then samples masked for a while (longer after each
    # rejection).
    grammar_optimistic: bool = False
    # Its grammar's state lives on the device: masked there, no host token needed to sample
    # (scheduler/grammar_states.py).
    grammar_on_device: bool = False
    grammar_masked_steps: int = 0
    grammar_rejections: int = 0

    # Logprobs
    input_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_top_logprobs: list[TopLogprobs | None] = field(default_factory=list)
    input_logprobs_done: bool = False
    input_logprobs_sent: bool = False
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    input_token_ids_logprobs: list[TopLogprobs | None] = field(default_factory=list)
    output_token_ids_logprobs: list[TopLogprobs] = field(default_factory=list)
    num_sent_outputs: int = 0              # output tokens already reported to the client
    detok_sent: bool = False               # the detokenizer got this request's DetokSpec

    @classmethod
    def from_message(cls, msg: TokenizedGenerateReq, seed: int, arrival: int) -> "Req":
        return cls(rid=msg.rid, origin_input_ids=list(msg.input_ids),
                   sampling_params=msg.sampling_params, seed=seed,
                   return_logprob=msg.return_logprob, logprob_start_len=msg.logprob_start_len,
                   top_logprobs_num=msg.top_logprobs_num, stream=msg.stream, arrival=arrival,
                   token_ids_logprob=msg.token_ids_logprob if msg.return_logprob else None)

    # ------------------------------------------------------------------ lengths

    @property
    def fill_ids(self) -> list[int]:
        """Every token whose KV the request needs: prompt + output so far."""
        return self.origin_input_ids + self.output_ids

    @property
    def prompt_len(self) -> int:
        return len(self.origin_input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def prefix_len(self) -> int:
        return len(self.prefix_indices)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens the next decode step computes for this request: one (its last sampled token),
        or, after a jump-forward, every forced token whose KV is not computed yet; plus the
        drafts a verify step checks. (A verify step in flight counts as accepted whole: the
        step after it is built on that guess, `spec_inflight`.)"""
        return (self.seq_len + self.num_pending + self.spec_inflight - self.kv_allocated_len
                + len(self.spec_drafts))

    def count_prompt_once(self) -> tuple[int, int]:
        """(prompt tokens, of them cached) for the cache-hit statistics the first time the
        prompt is done, by an extend step or as a short prefill's rows; (0, 0) afterwards (a
        retracted request computes its prompt again)."""
        if self.prompt_counted:
            return 0, 0
        self.prompt_counted = True
        return self.prompt_len, self.cached_tokens

    @property
    def remaining_prefill(self) -> int:
        """Tokens that still need KV before the request can decode."""
        return self.seq_len - self.kv_allocated_len

    @property
    def max_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def effective_logprob_start(self) -> int:
        """First prompt position whose logprob is returned (-1 means the last prompt token)."""
        if self.logprob_start_len < 0:
            return max(self.prompt_len - 1, 0)
        return min(self.logprob_start_len, self.prompt_len)

    @property
    def wants_input_logprobs(self) -> bool:
        return (self.return_logprob and not self.input_logprobs_done
                and self.effective_logprob_start < self.prompt_len)

    @property
    def samples_unmasked(self) -> bool:
        """A constrained request whose next decode row samples without the grammar mask (the
        grammar checks the token afterwards)."""
        return self.grammar_optimistic and self.grammar_masked_steps == 0

    @property
    def sampling_reads_output(self) -> bool:
        """Whether sampling the next token depends on the exact output so far (penalties, a
        grammar mask): such requests sample only after their last results are processed (the
        scheduler's deferred sampling). The min_new_tokens ban does not: it needs only the
        number of tokens before the sampled one, len(output_ids) + num_pending, known at
        launch (a row whose request jumped or was redrawn since is dropped anyway)."""
        return ((self.grammar is not None and not self.samples_unmasked
                 and not self.grammar_on_device)
                or self.sampling_params.has_penalties)

    @property
    def logit_adjustments_read_output(self) -> bool:
        """Whether the sampling tensors themselves depend on the output (penalties, the
        min_new_tokens EOS ban); a grammar only adds a mask."""
        p = self.sampling_params
        return (p.has_penalties
                or len(self.output_ids) + self.num_pending < p.min_new_tokens)

    def max_prefix_match(self) -> int:
        """How much of fill_ids may come from the cache: at least one token must be computed to
        get logits, and prompt logprobs need the hidden state of the token before the first one."""
        limit = self.seq_len - 1
        if self.wants_input_logprobs:
            limit = min(limit, max(self.effective_logprob_start - 1, 0))
        return max(limit, 0)

    def reset_kv(self) -> None:
        """After the caches released its KV (retraction, jump-forward): nothing computed; the
        next prefill finds what it can in the radix cache."""
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.last_node = None
        self.kv_allocated_len = 0
        self.extend_input_len = 0
        self.input_on_host = False
        self.forget_launched_steps()

    def jump_to(self, num_replaced: int, new_tokens: list[int], kv_kept: int) -> None:
        """Jump-forward: the last num_replaced output tokens become new_tokens, and only the
        first kv_kept tokens keep their KV (the caller released the slots after them). The
        request stays in the running batch; its next decode step computes the rest."""
        del self.output_ids[len(self.output_ids) - num_replaced:]
        self.output_ids.extend(new_tokens)
        self.kv_allocated_len = kv_kept
        self.input_on_host = True
        self.forget_launched_steps()

    def forget_launched_steps(self) -> None:
        # Launched steps that sampled for the old tokens no longer count (LaunchedStep.epochs).
        self.kv_epoch += 1
        self.num_pending = 0
        self.spec_inflight = 0
        self.spec_followup = []
