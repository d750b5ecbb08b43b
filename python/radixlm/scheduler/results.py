"""Step 4 of the scheduler loop: turn a batch's logits and samples into request progress.

Appends sampled tokens, records logprobs, checks stop conditions, hands finished requests'
KV to the prefix cache, and sends per-request deltas to the tokenizer side. What changes the
scheduler's own counters comes back as a StepResult for it to apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from radixlm.constrained.jump_forward import plan_jump
from radixlm.managers.detokenizer import StopStringChecker
from radixlm.managers.messages import BatchReqOutput, DetokSpec, FinishReason, ReqOutput
from radixlm.scheduler.grammar_sampling import on_rejection, redraw_from_alternatives
from radixlm.scheduler.launched_step import RowTokens
from radixlm.scheduler.request import Req

if TYPE_CHECKING:
    from radixlm.mem_cache.kv_cache_manager import KVCacheManager
    from radixlm.model_executor.model_runner import ForwardOutput
    from radixlm.scheduler.grammar_sampling import MaskedResampler
    from radixlm.scheduler.launched_step import LaunchedStep
    from radixlm.scheduler.speculation import Speculator


@dataclass
class Redrawn:
    """The token a rejected unmasked row gets instead: masked sampling's, with its logprob;
    `accepted`: the grammar has already accepted it."""
    token: int
    logprob: float
    accepted: bool = False


@dataclass
class StepResult:
    """What processing one step changed that the scheduler owns: it adds these to its counters
    (the processor never touches them; finished requests leave the running batch by their
    `finished` flag)."""
    prompt_tokens: int = 0      # prompts that finished their prefill this step
    cached_tokens: int = 0      # of which came from the prefix cache
    generated_tokens: int = 0   # tokens sampled and kept
    # Verify steps: (request slot, its next input token) for ModelRunner.last_token_ids, which
    # the sampler did not write (the accepted run's last token is known on the host only).
    next_inputs: list[tuple[int, int]] = field(default_factory=list)
    grammar_rejections: int = 0  # unmasked tokens the grammar rejected (sampled again)


class ResultProcessor:
    def __init__(self, kv: "KVCacheManager", send: Callable[[Any], None], tokenizer,
                 context_len: int, eos_token_ids: Sequence[int], jump_forward: bool = True,
                 speculator: "Speculator | None" = None,
                 resampler: "MaskedResampler | None" = None):
        self.kv = kv
        self.prefix_cache = kv.prefix_cache
        self.send = send
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.eos_token_ids = set(eos_token_ids)
        self.jump_forward = jump_forward
        self.speculator = speculator
        self.resampler = resampler

    def process(self, step: "LaunchedStep") -> StepResult:
        batch, out, sampled = step.batch, step.out, step.sampled
        row_of = {i: j for j, i in enumerate(step.sample_rows)}
        rows = step.wait()
        result = StepResult()
        released_tails: list[tuple[int, int, int]] = []   # KV the step's jumps gave back
        outputs: list[ReqOutput] = []
        redrawn = self._check_unmasked(step, rows) if step.unmasked else {}
        for i, req in enumerate(batch.reqs):
            if step.is_stale(i):
                continue  # jumped (or retracted) while this step ran: the row is moot
            if i in batch.verify_rows:
                self._accept_verified(req, step.verified(i), batch.verify_drafts[i],
                                      step.kv_lens[i], result, outputs, released_tails)
                continue
            j = row_of.get(i)
            if j is not None:
                req.num_pending -= 1
            if req.finished:
                # Ended while this step ran (an abort, or, under the overlap scheduler, a stop
                # found in the previous step's results): its token here is dropped.
                continue
            if batch.forward_mode.is_extend:
                # (The step's KV went into the prefix cache when it was launched.)
                prompt_done = step.kv_lens[i] >= req.seq_len
                self._record_input_logprobs(req, out, i, step.kv_lens[i])
                if not prompt_done:
                    continue                            # a chunk of a longer prompt
                prompt, cached = req.count_prompt_once()
                result.prompt_tokens += prompt
                result.cached_tokens += cached
            if j is None and batch.forward_mode.is_decode:
                continue  # a jump's forced tokens that did not all fit: the rest come next step
            if j is None:                               # max_new_tokens == 0
                self.finish(req, FinishReason("length", length=0), send=False)
                outputs.append(self._output(req))
                continue
            # Drawn without the mask and accepted above (a sampled row holds one token).
            checked = step.unmasked[j] if step.unmasked else False
            tokens = rows[j]
            if j in redrawn:              # sampled without the mask and rejected
                result.grammar_rejections += 1
                tokens = self._adopt_redrawn(req, redrawn[j], tokens, released_tails)
                if tokens is None:
                    if req.finished:
                        outputs.append(self._output(req))
                    continue
            reason = None
            for k, token in enumerate(tokens.token_ids):  # accepted tokens, in order
                req.output_ids.append(token)
                result.generated_tokens += 1
                if req.return_logprob:
                    req.output_token_logprobs.append((tokens.logprobs[k], token))
                    if req.top_logprobs_num > 0 and sampled.top_logprobs is not None:
                        vals, toks = sampled.top_logprobs[j]  # (top logprobs: one per row)
                        req.output_top_logprobs.append(list(zip(vals, toks)))
                    if req.token_ids_logprob and sampled.token_ids_logprobs is not None:
                        req.output_token_ids_logprobs.append(sampled.token_ids_logprobs[j])
                reason = self._check_finished(req, token)
                if reason is None and req.grammar is not None:
                    reason = self._advance_grammar(req, token, accepted=checked)
                if reason is not None:
                    break  # tokens after a stop are dropped
            if reason is not None:
                self.finish(req, reason, send=False)
                outputs.append(self._output(req))
                continue
            if req.grammar is not None and self._jump_forward(req, released_tails):
                if req.stream or req.finished:
                    outputs.append(self._output(req))
                continue
            # Streams get every token; others their first (for time-to-first-token) and last.
            if req.stream or len(req.output_ids) == 1:
                outputs.append(self._output(req))
        self.kv.release_tails(released_tails)
        if outputs:
            self.send(BatchReqOutput(outputs))
        return result

    def _accept_verified(self, req: Req, verified: "RowTokens",
                         drafted: tuple[list[int], list[int] | None], kv_len: int,
                         result: StepResult, outputs: list[ReqOutput],
                         released_tails: list[tuple[int, int, int]]) -> None:
        """A verify step's outcome for one request: append the accepted tokens (up to a stop
        condition, or a grammar's jump-forward, tried after each token as one token a step
        would) with their logprobs, keep the KV of the rows whose inputs stay in the text,
        release the rest. `kv_len`: the request's KV length once the step was built (a
        pipelined step built since holds the positions after it)."""
        if req.finished:    # ended while the step ran (its KV went to the cache then)
            return
        targets = verified.token_ids
        req.spec_inflight -= len(targets)
        last_position = kv_len - len(targets)   # row 0's input
        reason, appended, jumped = None, 0, False
        tokens, rows = self.speculator.accept_rows(req, targets, drafted)
        for k, token in enumerate(tokens):
            # Token k is the target of row rows[k] (a chain's: row k): its logprobs are that
            # row's.
            req.output_ids.append(token)
            appended += 1
            result.generated_tokens += 1
            if req.return_logprob:
                req.output_token_logprobs.append((verified.logprobs[rows[k]], token))
                if req.top_logprobs_num > 0:
                    req.output_top_logprobs.append(list(zip(*verified.top_logprobs[rows[k]])))
                if req.token_ids_logprob:
                    req.output_token_ids_logprobs.append(verified.token_ids_logprobs[rows[k]])
            reason = self._check_finished(req, token)
            if reason is None and req.grammar is not None:
                reason = self._advance_grammar(req, token)
            if reason is not None:
                break
            # Rows 0..appended-1 computed the KV of tokens that stay (the last sampled token
            # and the accepted drafts); the newest token has none yet.
            if req.grammar is not None and self._jump_forward(
                    req, released_tails, kv_len=last_position + appended):
                jumped = True    # the drafts accepted after this token are dropped
                break
        self.speculator.record_used(tokens, appended)
        if rows[:appended] != list(range(appended)):
            # A tree's accepted nodes are not its first rows: move their slots to the
            # positions they now hold in the text, the others after them (released below).
            assert not jumped, "a grammar request drafts chains only"
            self.kv.reorder_slots(req.req_pool_idx, last_position,
                                  rows[:appended] + _others(rows[:appended], len(targets)))
        # A pipelined step in flight (built on every draft being accepted) holds positions
        # from kv_len on: it stands if they all were, else it is dropped with its KV.
        pipelined_stands = (req.kv_allocated_len > kv_len and reason is None
                            and appended == len(targets))
        if not jumped and not pipelined_stands:
            keep = last_position + appended
            released_tails.append((req.req_pool_idx, keep, req.kv_allocated_len))
            req.kv_allocated_len = keep
            if req.spec_inflight or req.num_pending:
                req.forget_launched_steps()    # (the pipelined step's rows for it are moot)
            if appended < len(targets):        # (the continuation went another way)
                req.spec_followup = []
        if reason is not None:
            self.finish(req, reason, send=False)
            outputs.append(self._output(req))
            return
        if jumped:      # its next step feeds the forced tokens
            if req.stream or req.finished:
                outputs.append(self._output(req))
            return
        if not pipelined_stands:    # (else the step in flight was fed the same token)
            result.next_inputs.append((req.req_pool_idx, req.output_ids[-1]))
        if req.stream or len(req.output_ids) == appended:
            outputs.append(self._output(req))

    def _record_input_logprobs(self, req: Req, out: "ForwardOutput", i: int,
                               kv_len: int) -> None:
        """Row i's prompt logprobs; kv_len: the request's tokens with KV once the step was
        launched (a later chunk may have been launched since)."""
        if not req.wants_input_logprobs:
            return
        if out.input_logprobs is not None:
            got = out.input_logprobs[i]
            req.input_token_logprobs.extend(got.token_logprobs)
            req.input_top_logprobs.extend(got.top_logprobs if req.top_logprobs_num else
                                          [None] * len(got.token_logprobs))
            req.input_token_ids_logprobs.extend(got.token_ids_logprobs if req.token_ids_logprob
                                                else [None] * len(got.token_logprobs))
        if kv_len >= req.prompt_len:
            if req.effective_logprob_start == 0:   # the first prompt token has no context
                req.input_token_logprobs.insert(0, (None, req.origin_input_ids[0]))
                req.input_top_logprobs.insert(0, None)
                req.input_token_ids_logprobs.insert(0, None)
            req.input_logprobs_done = True

    def _check_finished(self, req: Req, token: int) -> FinishReason | None:
        params = req.sampling_params
        # Stops come before the length limits: a stop token or string completed by the last
        # token allowed is a stop (OpenAI's "hit a stop sequence", as vLLM reports it), and
        # the output is trimmed of it as of any other stop.
        if len(req.output_ids) >= params.min_new_tokens:
            if token in params.stop_token_ids:
                return FinishReason("stop", matched=token)
            if not params.ignore_eos and token in self.eos_token_ids:
                return FinishReason("stop", matched=token)
        if (params.stop or params.stop_regex) and len(req.output_ids) >= params.min_new_tokens:
            if req.stop_checker is None:
                # A stop string in the first min_new_tokens - 1 tokens' text is no match.
                first = max(params.min_new_tokens - 1, 0)
                req.stop_checker = self._stop_checker(req, first)
                matched = req.stop_checker.check(req.output_ids[first:])
            else:
                matched = req.stop_checker.check([token])
            if matched is not None:
                return FinishReason("stop", matched=matched)
        if len(req.output_ids) >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        if req.seq_len >= self.context_len:
            return FinishReason("length", length=len(req.output_ids))
        return None

    # ------------------------------------------------------------------ structured outputs

    def _advance_grammar(self, req: Req, token: int,
                         accepted: bool = False) -> FinishReason | None:
        """Move the grammar past `token` (`accepted`: the caller already did) and say whether
        that ended the request."""
        if not accepted and not req.grammar.accept_token(token):
            return FinishReason("abort", message=f"token {token} violates the grammar",
                                status_code=500)
        if req.grammar.is_terminated():
            return FinishReason("stop", matched=token)
        return None

    def _check_unmasked(self, step: "LaunchedStep", rows: list["RowTokens"]
                        ) -> dict[int, "Redrawn | None"]:
        """Let each grammar accept the token its row drew without the mask; draw the rejected
        rows again under their masks: greedy ones from the step's best tokens where those
        settle it, the others all in one batch (grammar_sampling.MaskedResampler).
        Returns {sampled row: its redrawn token, or None where no logits were kept}."""
        reqs, unmasked = step.batch.reqs, step.unmasked
        rejected: list[tuple[int, Req]] = []
        for j, i in enumerate(step.sample_rows):   # (a decode step's: no verify rows)
            if not unmasked[j]:
                continue
            req = reqs[i]
            if req.finished or step.is_stale(i):
                continue
            if not req.grammar.accept_token(rows[j].token_ids[0]):
                rejected.append((j, req))
        if not rejected:
            return {}
        redrawn: dict[int, Redrawn | None] = {}
        on_device: list[tuple[int, Req]] = []
        for j, req in rejected:
            on_rejection(req)             # its next rows sample masked
            alts = step.alternatives(j) if req.sampling_params.is_greedy else None
            got = (redraw_from_alternatives(req.grammar, rows[j].token_ids[0], *alts)
                   if alts is not None else None)
            if got is not None:
                redrawn[j] = Redrawn(got[0], got[1], accepted=True)
            else:
                on_device.append((j, req))
        if on_device:
            drawn = (self.resampler.resample(step, [j for j, _ in on_device],
                                             [r for _, r in on_device])
                     if self.resampler else [None] * len(on_device))
            for (j, _), d in zip(on_device, drawn):
                redrawn[j] = Redrawn(d[0], d[1]) if d is not None else None
        return redrawn

    def _adopt_redrawn(self, req: Req, drawn: "Redrawn | None", rejected: "RowTokens",
                       released_tails: list[tuple[int, int, int]]) -> "RowTokens | None":
        """Replace a rejected token by the one drawn under the mask at the same position.

        The step in flight after this one (overlap) was launched with the rejected token: its
        row is dropped and the KV it writes at that position given back (jump_to bumps the
        request's epoch), so the request's next decode step feeds the new token from the host.
        Without a drawn token (no logits kept) the request keeps the KV before its last token,
        whose row its next decode step computes again, sampling under the mask; then None."""
        if drawn is None:
            # A decoding request's last token was computed by a decode step, never shared.
            assert req.seq_len - 1 >= req.prefix_len, (req.seq_len, req.prefix_len)
            self._keep_kv(req, req.seq_len - 1, released_tails)
            return None
        token, logprob = drawn.token, drawn.logprob
        self._keep_kv(req, req.seq_len, released_tails)  # up to the last accepted token
        if not drawn.accepted and not req.grammar.accept_token(token):
            # The mask allows nothing (cannot happen).
            self.finish(req, FinishReason("abort", message="the grammar allows no token",
                                          status_code=500),
                        send=False)
            return None
        return RowTokens([token], [logprob], rejected.top_logprobs)

    @staticmethod
    def _keep_kv(req: Req, keep: int, released_tails: list[tuple[int, int, int]]) -> None:
        """`req` keeps the KV of its first `keep` tokens; its next decode step feeds the rest
        from the host, and the steps in flight for it are dropped."""
        if keep < req.kv_allocated_len:
            released_tails.append((req.req_pool_idx, keep, req.kv_allocated_len))
        req.jump_to(0, [], keep)

    def _jump_forward(self, req: Req, released_tails: list[tuple[int, int, int]],
                      kv_len: int | None = None) -> bool:
        """Append the grammar's forced continuation. The request keeps its KV up to the first
        replaced token and stays in the running batch: its next decode step computes the forced
        tokens (one row each) and samples after the last, instead of one step per token. The
        KV after that token goes into `released_tails`, freed once for the whole step.
        `kv_len`: the request's tokens whose KV stays valid (a verify step: fewer than it
        allocated); by default all it allocated."""
        if not self.jump_forward or req.return_logprob:
            return False  # jumped tokens have no sampled logprobs to report
        forced = req.grammar.find_jump_forward_string()
        if not forced:
            return False  # (nothing forced: the common case, checked before the rest)
        unsent = len(req.output_ids) - req.num_sent_outputs
        # Tokens in the shared prefix (a re-prefilled request's outputs) are not replaceable.
        replaceable = min(unsent, req.seq_len - req.prefix_len)
        room = min(req.remaining_new_tokens, self.context_len - req.seq_len)
        jump = plan_jump(self.tokenizer, req.grammar, req.output_ids, replaceable, room, forced)
        if jump is None:
            return False
        kv_len = req.kv_allocated_len if kv_len is None else kv_len
        keep = min(kv_len, req.seq_len - jump.num_replaced)
        released_tails.append((req.req_pool_idx, keep, req.kv_allocated_len))
        req.jump_to(jump.num_replaced, jump.new_tokens, keep)
        stopped = self._stop_in_forced_tokens(req, len(req.output_ids) - len(jump.new_tokens))
        if stopped is not None:
            self.finish(req, stopped, send=False)
        elif len(req.output_ids) >= req.max_new_tokens:
            self.finish(req, FinishReason("length", length=req.max_new_tokens), send=False)
        elif req.grammar.is_terminated():
            self.finish(req, FinishReason("stop", matched=req.output_ids[-1]), send=False)
        return True

    def _stop_checker(self, req: Req, skipped: int) -> StopStringChecker:
        """A stop checker for `req` that has read its first `skipped` output tokens without
        looking for stops in them."""
        p = req.sampling_params
        checker = StopStringChecker(self.tokenizer, p.stop, p.skip_special_tokens,
                                    p.spaces_between_special_tokens, p.stop_regex)
        checker.skip(req.output_ids[:skipped])
        return checker

    def _stop_in_forced_tokens(self, req: Req, first: int) -> FinishReason | None:
        """A stop string or stop_regex in jump-forward's tokens (output_ids[first:]) stops the
        request there, as in sampled ones; the forced tokens after it are dropped. Otherwise
        the request's stop checker is rebuilt over the new tokens (the jump re-tokenized the
        text it had seen)."""
        params = req.sampling_params
        if not (params.stop or params.stop_regex):
            return None
        ids = req.output_ids
        req.stop_checker = None
        start = max(first, params.min_new_tokens - 1, 0)
        if start >= len(ids):
            return None     # (before min_new_tokens: _check_finished starts a checker later)
        # (no match ends before `start`: checked already, or before min_new_tokens)
        checker = self._stop_checker(req, start)
        for k in range(start, len(ids)):
            matched = checker.check([ids[k]])
            if matched is not None:
                del ids[k + 1:]
                return FinishReason("stop", matched=matched)
        req.stop_checker = checker
        return None

    # ------------------------------------------------------------------ finishing

    def finish(self, req: Req, reason: FinishReason, send: bool = True) -> None:
        """End a request; KV it holds goes to the prefix cache."""
        req.finished_reason = reason
        if req.req_pool_idx is not None:
            self.prefix_cache.cache_finished_req(req)
        if send:
            self.send(BatchReqOutput([self._output(req)]))

    def _output(self, req: Req) -> ReqOutput:
        start = req.num_sent_outputs
        req.num_sent_outputs = len(req.output_ids)
        out = ReqOutput(
            rid=req.rid, new_token_ids=req.output_ids[start:],
            finish_reason=req.finished_reason, prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids), cached_tokens=req.cached_tokens,
            spec_verify_ct=req.spec_verify_ct,
            output_token_logprobs=req.output_token_logprobs[start:] if req.return_logprob else [],
            output_top_logprobs=req.output_top_logprobs[start:] if req.return_logprob else [],
            output_token_ids_logprobs=(req.output_token_ids_logprobs[start:]
                                       if req.token_ids_logprob else []))
        if not req.detok_sent:
            p = req.sampling_params
            out.detok = DetokSpec(p.skip_special_tokens, p.spaces_between_special_tokens,
                                  list(p.stop), p.no_stop_trim, p.min_new_tokens,
                                  list(p.stop_regex))
            req.detok_sent = True
        if req.return_logprob and not req.input_logprobs_sent:
            out.input_token_logprobs = list(req.input_token_logprobs)
            out.input_top_logprobs = list(req.input_top_logprobs)
            out.input_token_ids_logprobs = list(req.input_token_ids_logprobs)
            req.input_logprobs_sent = True
        return out


def _others(first: list[int], n: int) -> list[int]:
    """0..n-1 without the members of `first`, in order."""
    taken = set(first)
    return [j for j in range(n) if j not in taken]
