"""Step 4 of the scheduler loop: turn a batch's logits and samples into request progress.

Appends sampled tokens, records logprobs, checks stop conditions, hands finished requests'
KV to the prefix cache, and sends per-request deltas to the tokenizer side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.constrained.jump_forward import plan_jump
from radixlm.managers.detokenizer import StopStringChecker
from radixlm.managers.messages import BatchReqOutput, DetokSpec, FinishReason, ReqOutput
from radixlm.core.forward_batch import ForwardBatch
from radixlm.scheduler.request import Req
from radixlm.scheduler.schedule_batch import ScheduleBatch, input_logprob_targets

if TYPE_CHECKING:
    from radixlm.model_executor.model_runner import ForwardOutput
    from radixlm.scheduler.launched_step import LaunchedStep
    from radixlm.scheduler.scheduler import Scheduler


class ResultProcessor:
    def __init__(self, scheduler: "Scheduler", tokenizer=None):
        self.s = scheduler
        self.tokenizer = tokenizer

    # ------------------------------------------------------------------ before the forward

    def input_logprob_targets(self, batch: ScheduleBatch,
                              fb: ForwardBatch) -> tuple[list[list[int]], list[int]]:
        if not fb.input_logprob_rows:
            return [], []
        targets = [input_logprob_targets(r, fb.extend_prefix_lens_cpu[i], fb.input_logprob_rows[i])
                   for i, r in enumerate(batch.reqs)]
        return targets, [r.top_logprobs_num for r in batch.reqs]

    def samples_now(self, req: Req, batch: ScheduleBatch) -> bool:
        """Whether this step produces a token for req (not for a prefill chunk mid-prompt, and
        not for max_new_tokens == 0, which only fills the cache). Called after the batch was
        prepared, when kv_committed_len already counts this step's tokens."""
        if batch.forward_mode.is_decode:
            return True
        return req.kv_committed_len >= req.seq_len and req.max_new_tokens > 0

    # ------------------------------------------------------------------ after the forward

    def process(self, step: "LaunchedStep") -> None:
        s = self.s
        batch, out, sampled = step.batch, step.out, step.sampled
        row_of = {i: j for j, i in enumerate(step.sample_rows)}
        ids, lps = step.wait()
        jumped: list[Req] = []  # a list: they re-enter the queue in batch order
        outputs: list[ReqOutput] = []
        generated = 0
        for i, req in enumerate(batch.reqs):
            j = row_of.get(i)
            if j is not None:
                req.num_pending -= 1
            if req.finished:
                # Ended while this step ran (an abort, or, under the overlap scheduler, a stop
                # found in the previous step's results): its token here is dropped.
                continue
            if batch.forward_mode.is_extend:
                self._record_input_logprobs(req, out, i)
                if not req.prompt_counted and req.kv_committed_len >= req.seq_len:
                    req.prompt_counted = True
                    s.prompt_tokens_total += req.prompt_len
                    s.cached_tokens_total += req.cached_tokens
            if req.kv_committed_len < req.seq_len:      # a chunk of a longer prompt
                s.prefix_cache.cache_unfinished_req(req)
                continue
            if j is None:                               # max_new_tokens == 0
                self.finish(req, FinishReason("length", length=0), send=False)
                outputs.append(self._output(req))
                continue
            token = ids[j]
            req.output_ids.append(token)
            generated += 1
            if req.return_logprob:
                req.output_token_logprobs.append((lps[j], token))
                if req.top_logprobs_num > 0 and sampled.top_logprobs is not None:
                    vals, toks = sampled.top_logprobs[j]
                    req.output_top_logprobs.append(list(zip(vals, toks)))
            reason = self._check_finished(req, token)
            if reason is None and req.grammar is not None:
                reason = self._advance_grammar(req, token)
            if reason is not None:
                self.finish(req, reason, send=False)
                outputs.append(self._output(req))
                continue
            if req.grammar is not None and self._jump_forward(req):
                jumped.append(req)
                if req.stream or req.finished:
                    outputs.append(self._output(req))
                continue
            if batch.forward_mode.is_extend:
                # The prompt's KV goes into the tree now, not when the request ends: requests
                # running alongside (or deferred by PrefillAdder) share it.
                s.prefix_cache.cache_unfinished_req(req)
            # Streams get every token; others their first (for time-to-first-token) and last.
            if req.stream or len(req.output_ids) == 1:
                outputs.append(self._output(req))
        s.gen_throughput.add(generated)
        gone = {id(r) for r in jumped}
        s.running = [r for r in s.running if not r.finished and id(r) not in gone]
        s.waiting[:0] = [r for r in jumped if not r.finished]  # prefill them next step
        if outputs:
            s.send(BatchReqOutput(outputs))

    def _record_input_logprobs(self, req: Req, out: "ForwardOutput", i: int) -> None:
        if not req.wants_input_logprobs:
            return
        if out.input_logprobs is not None:
            got = out.input_logprobs[i]
            req.input_token_logprobs.extend(got.token_logprobs)
            req.input_top_logprobs.extend(got.top_logprobs if req.top_logprobs_num else
                                          [None] * len(got.token_logprobs))
        if req.kv_committed_len >= req.prompt_len:
            if req.effective_logprob_start == 0:   # the first prompt token has no context
                req.input_token_logprobs.insert(0, (None, req.origin_input_ids[0]))
                req.input_top_logprobs.insert(0, None)
            req.input_logprobs_done = True

    def _check_finished(self, req: Req, token: int) -> FinishReason | None:
        params = req.sampling_params
        if len(req.output_ids) >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        if req.seq_len >= self.s.runner.model_config.context_len:
            return FinishReason("length", length=len(req.output_ids))
        if len(req.output_ids) >= params.min_new_tokens:
            if token in params.stop_token_ids:
                return FinishReason("stop", matched=token)
            if not params.ignore_eos and token in self.s.runner.model_config.eos_token_ids:
                return FinishReason("stop", matched=token)
        if params.stop and len(req.output_ids) >= params.min_new_tokens:
            if req.stop_checker is None:
                req.stop_checker = StopStringChecker(self.tokenizer, params.stop,
                                                     params.skip_special_tokens,
                                                     params.spaces_between_special_tokens)
                matched = req.stop_checker.check(req.output_ids)
            else:
                matched = req.stop_checker.check([token])
            if matched is not None:
                return FinishReason("stop", matched=matched)
        return None

    # ------------------------------------------------------------------ structured outputs

    def _advance_grammar(self, req: Req, token: int) -> FinishReason | None:
        if not req.grammar.accept_token(token):
            return FinishReason("abort", message=f"token {token} violates the grammar")
        if req.grammar.is_terminated():
            return FinishReason("stop", matched=token)
        return None

    def _jump_forward(self, req: Req) -> bool:
        """Append the grammar's forced continuation; the request then goes through one extend
        step (its prefix from the radix cache) instead of a decode step per forced token."""
        s = self.s
        if s.args.disable_jump_forward or req.return_logprob:
            return False  # jumped tokens have no sampled logprobs to report
        unsent = len(req.output_ids) - req.num_sent_outputs
        room = req.remaining_new_tokens
        jump = plan_jump(self.tokenizer, req.grammar, req.output_ids, unsent, room)
        if jump is None:
            return False
        # The tree takes the KV computed so far under the old tokens; then the tail changes.
        s.prefix_cache.cache_finished_req(req)
        req.reset_kv()
        del req.output_ids[len(req.output_ids) - jump.num_replaced:]
        req.output_ids.extend(jump.new_tokens)
        if len(req.output_ids) >= req.max_new_tokens:
            self.finish(req, FinishReason("length", length=req.max_new_tokens), send=False)
        elif req.grammar.is_terminated():
            self.finish(req, FinishReason("stop", matched=req.output_ids[-1]), send=False)
        return True

    # ------------------------------------------------------------------ finishing

    def finish(self, req: Req, reason: FinishReason, send: bool = True) -> None:
        """End a request; KV it holds goes to the prefix cache."""
        req.finished_reason = reason
        if req.req_pool_idx is not None:
            self.s.prefix_cache.cache_finished_req(req)
        if send:
            self.s.send(BatchReqOutput([self._output(req)]))

    def _output(self, req: Req) -> ReqOutput:
        start = req.num_sent_outputs
        req.num_sent_outputs = len(req.output_ids)
        out = ReqOutput(
            rid=req.rid, new_token_ids=req.output_ids[start:],
            finish_reason=req.finished_reason, prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids), cached_tokens=req.cached_tokens,
            output_token_logprobs=req.output_token_logprobs[start:] if req.return_logprob else [],
            output_top_logprobs=req.output_top_logprobs[start:] if req.return_logprob else [])
        if not req.detok_sent:
            p = req.sampling_params
            out.detok = DetokSpec(p.skip_special_tokens, p.spaces_between_special_tokens,
                                  list(p.stop), p.no_stop_trim)
            req.detok_sent = True
        if req.return_logprob and not req.input_logprobs_sent:
            out.input_token_logprobs = list(req.input_token_logprobs)
            out.input_top_logprobs = list(req.input_top_logprobs)
            req.input_logprobs_sent = True
        return out
