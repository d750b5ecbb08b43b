"""TokenizerManager: the asyncio front of the engine.

It validates and tokenizes requests, sends them to the scheduler, folds the detokenizer's
outputs (token ids + text deltas) into SGLang-shaped response dicts, and aborts requests whose
caller went away. It runs on one event loop; outputs arrive through `handle_output`, which must
be called on that loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from radixlm.managers.generate_request import GenerateReqInput, SingleGenerate
from radixlm.managers.messages import (AbortReq, BatchReqOutput, FinishReason, FlushCacheReq,
                                       FlushCacheResult, GetStatsReq, ProfileReq, ProfileResult,
                                       ReqOutput, SchedulerReady, SchedulerStats,
                                       TokenizedGenerateReq, UpdateWeightsReq,
                                       UpdateWeightsResult, expanded_from)
from radixlm.managers.no_tokenizer import check_without_tokenizer, without_text
from radixlm.managers.sequence_checks import check_sequence, prompt_ids

logger = logging.getLogger(__name__)


# The server's own requests (n > 1's shared-prompt prefill, /health_generate's probe): not
# counted in the metrics.
INTERNAL_RID_PREFIX = "radixlm-internal-"


class EngineDeadError(RuntimeError):
    pass


class RequestRefusedError(RuntimeError):
    """The scheduler refused the request for now (--max-queued-requests: its queue is full);
    `status` is the HTTP status (429), a client retries later."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass
class ReqState:
    single: SingleGenerate
    prompt_ids: list[int]
    return_text_in_logprobs: bool
    text: str = ""
    created: float = field(default_factory=time.perf_counter)
    last_output: float | None = None
    first_output: float | None = None   # when its first token came (time to first token)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int = 0
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    input_token_ids_logprobs: list = field(default_factory=list)
    output_token_ids_logprobs: list = field(default_factory=list)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    submitted: bool = False         # sent to the scheduler
    # Given up by its caller (an error, a disconnect) before the scheduler ended it: it keeps
    # its rid until its last output arrives, so that a new request reusing the rid gets none
    # of its outputs (and is told the rid is still running).
    abandoned: bool = False
    # Part of a request refused as a whole (a later prompt of its batch failed its checks):
    # the client got a 400, so the metrics do not count it as a request served or aborted.
    refused_with_request: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class TokenizerManager:
    def __init__(self, tokenizer, ready: SchedulerReady, send: Callable[[Any], None],
                 allow_auto_truncate: bool = False, stream_interval: int = 1,
                 preferred_sampling_params: dict[str, Any] | None = None,
                 log_requests: bool = False,
                 weight_version: str = "default", stream_output: bool = False,
                 max_queued_requests: int | None = None):
        self.tokenizer = tokenizer
        # --log-requests: each request's prompt and parameters, and its output, logged
        self.log_requests = log_requests
        # --preferred-sampling-params: under every request's own sampling_params
        self.preferred_sampling_params = preferred_sampling_params or {}
        # --weight-version: the served weights' label (/get_model_info); a weight update
        # that names one replaces it
        self.weight_version = weight_version
        self.allow_auto_truncate = allow_auto_truncate   # --allow-auto-truncate
        self.stream_interval = stream_interval           # --stream-interval
        self.stream_output = stream_output               # --stream-output: new ids per chunk
        # --max-queued-requests: with it, a request of more sequences than the running batch
        # and the queue hold together can never be admitted (a 400, not a retryable 429)
        self.max_sequences = (None if max_queued_requests is None
                              else ready.max_running_requests + max_queued_requests)
        self.ready = ready
        self.send = send
        self.states: dict[str, ReqState] = {}
        self._pending: dict[type, list[asyncio.Future]] = {FlushCacheResult: [],
                                                           UpdateWeightsResult: [],
                                                           SchedulerStats: [],
                                                           ProfileResult: []}
        self.dead_reason: str | None = None
        # When the scheduler last sent request outputs (time.monotonic())
        self.last_output_time = 0.0
        self.metrics = None  # a MetricsCollector when --enable-metrics

    @property
    def context_len(self) -> int:
        return self.ready.context_len

    # ------------------------------------------------------------------ requests

    def tokenize(self, single: SingleGenerate) -> list[int]:
        return prompt_ids(single, self.tokenizer, self.ready, self.allow_auto_truncate)

    async def generate(self, obj: GenerateReqInput) -> AsyncIterator[dict | list[dict]]:
        """Yields, for a single sequence, response dicts (each a snapshot; one when not
        streaming); for a batch, either the final list, or per-sequence snapshots with an
        `index` field when streaming. Raises ValueError for bad input."""
        self._check_alive()
        states: list[ReqState] = []
        try:
            warm = self._check_and_send(obj, states)
        except BaseException as e:
            for st in states:
                st.refused_with_request = isinstance(e, ValueError)
                self._release(st)
            if isinstance(e, ValueError):
                # (the 400 leaves nothing behind: a client may resend the batch at once,
                # with the same rids; the scheduler ends what was sent within a step)
                await self._until_ended([st for st in states if st.abandoned])
            raise
        try:
            await self._submit_after_warm_up(warm, obj.stream)
            if obj.stream:
                async for out in self._stream(states, batch=obj.is_batch or len(states) > 1):
                    yield out
            else:
                for st in states:
                    await self._wait_finished(st)
                outs = [self.response(st) for st in states]
                yield outs if (obj.is_batch or len(outs) > 1) else outs[0]
        finally:
            for st in states:
                self._release(st)

    def _check_and_send(self, obj: GenerateReqInput, states: list[ReqState]
                        ) -> list[tuple[list[ReqState], list[int]]]:
        """Check the request prompt by prompt and send each to the scheduler as soon as it
        passes: the checks of a batch of 256 prompts of 4k ids take ~0.1 s, during which the GPU
        already works on the first ones. Every sequence's state goes into `states` as it is
        made (the caller releases them, which aborts those sent, if a later prompt fails: the
        request fails as a whole, ValueError). Returns the groups of n > 1 samples, which are
        sent only once their shared prompt is cached."""
        warm: list[tuple[list[ReqState], list[int]]] = []
        seen: set[str] = set()
        # The server's own requests take no --preferred-sampling-params: a preferred n would
        # make an n > 1 prompt's shared prefill ask for n again (and again, without end).
        internal = isinstance(obj.rid, str) and obj.rid.startswith(INTERNAL_RID_PREFIX)
        preferred = {} if internal else self.preferred_sampling_params
        if (self.max_sequences is not None
                and obj.declared_sequences(preferred) > self.max_sequences):
            # (before any prompt is sent: none runs, none is counted)
            raise ValueError(
                f"the request has more sequences (prompts x n) than the server runs and queues "
                f"at once ({self.max_sequences}: --max-running-requests + "
                f"--max-queued-requests)")
        for group in obj.groups(preferred):
            if self.tokenizer is None:
                check_without_tokenizer(group[0], obj.return_text_in_logprobs)
            ids = self.tokenize(group[0])
            for s in group:
                check_sequence(s, ids, seen, self.states, self.ready, self.allow_auto_truncate)
            group_states = [self._new_state(s, ids, obj.return_text_in_logprobs) for s in group]
            states += group_states
            if len(group) > 1:
                warm.append((group_states, ids))
            else:
                self._send_sequence(group_states[0], obj.stream)
        return warm

    def _release(self, st: ReqState) -> None:
        """The caller is done with `st` (answered, failed or gone): a sequence the scheduler
        still runs is aborted and keeps its rid until its last output (`abandoned`)."""
        if st.submitted and not st.finished and self.dead_reason is None:
            self.send(AbortReq(st.single.rid))
            st.abandoned = True
        elif self.states.get(st.single.rid) is st:
            del self.states[st.single.rid]

    async def _until_ended(self, states: list[ReqState], timeout_s: float = 30.0) -> None:
        """Wait until the scheduler has ended these (aborted) sequences, at most `timeout_s`
        (a scheduler that is stuck: the rids stay taken, "already running")."""
        async def ended(st: ReqState) -> None:
            while not st.finished and self.dead_reason is None:
                await st.updated.wait()
                st.updated.clear()
        if states:
            waits = [asyncio.ensure_future(ended(st)) for st in states]
            _, late = await asyncio.wait(waits, timeout=timeout_s)
            for w in late:
                w.cancel()

    def _new_state(self, single: SingleGenerate, ids: list[int], text_in_lp: bool) -> ReqState:
        st = ReqState(single, ids, text_in_lp)
        self.states[single.rid] = st
        return st

    def _send_sequence(self, st: ReqState, stream: bool) -> None:
        s = st.single
        if self.log_requests and not s.rid.startswith(INTERNAL_RID_PREFIX):
            prompt = s.text if s.text is not None else st.prompt_ids
            logger.info("Receive: rid=%s prompt=%s sampling_params=%s", s.rid,
                        _clip(repr(prompt)), _clip(repr(s.sampling_params)))
        self.send(TokenizedGenerateReq(
            rid=s.rid, input_ids=st.prompt_ids, sampling_params=s.sampling_params,
            return_logprob=s.return_logprob, logprob_start_len=s.logprob_start_len,
            top_logprobs_num=s.top_logprobs_num, stream=stream,
            token_ids_logprob=s.token_ids_logprob))
        st.submitted = True

    async def _submit_after_warm_up(self, warm: list[tuple[list[ReqState], list[int]]],
                                    stream: bool) -> None:
        # n > 1: prefill the shared prompt once (max_new_tokens 0), then the n samples all find
        # it in the radix cache instead of computing it n times in one batch.
        if not warm:
            return
        await asyncio.gather(*(self._prefill_only(ids, g[0].single.rid) for g, ids in warm))
        for group_states, _ in warm:
            for st in group_states:
                if not st.finished:     # (aborted while its prompt was prefilled)
                    self._send_sequence(st, stream)

    async def _prefill_only(self, ids: list[int], rid: str) -> None:
        obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 0, "n": 1},
                               rid=f"{INTERNAL_RID_PREFIX}{rid}-prefix")
        async for _ in self.generate(obj):
            pass

    async def _wait_finished(self, st: ReqState) -> None:
        while not st.finished:
            await st.updated.wait()
            st.updated.clear()
            self._check_alive()
        _raise_if_rejected(st)

    async def _stream(self, states: list[ReqState], batch: bool) -> AsyncIterator[dict]:
        pending = list(states)
        sent_len = {id(st): -1 for st in states}
        while pending:
            waiters = [asyncio.ensure_future(st.updated.wait()) for st in pending]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            self._check_alive()
            for st in list(pending):
                if not st.updated.is_set():
                    continue
                st.updated.clear()
                _raise_if_rejected(st)
                if self._stream_due(st, sent_len[id(st)]):
                    sent = max(sent_len[id(st)], 0)
                    sent_len[id(st)] = len(st.output_ids)
                    out = self.response(st)
                    if self.stream_output:
                        out["output_ids"] = out["output_ids"][sent:]
                    if batch:
                        out["index"] = st.single.index
                    yield out
                if st.finished:
                    pending.remove(st)

    def _stream_due(self, st: ReqState, sent: int) -> bool:
        """Whether a stream sends `st` now, having sent it with `sent` tokens (-1: never):
        at its end, at its first token, then every stream_interval tokens."""
        if st.finished:
            return True
        n = len(st.output_ids)
        interval = st.single.sampling_params.stream_interval or self.stream_interval
        return n != sent and (sent <= 0 or n - sent >= interval)

    # ------------------------------------------------------------------ scheduler outputs

    def handle_output(self, msg: Any) -> None:
        if isinstance(msg, BatchReqOutput):
            self.last_output_time = time.monotonic()     # (/health_generate: it generates)
            for out in msg.outputs:
                st = self.states.get(out.rid)
                if st is not None:
                    self._apply(st, out)
        elif type(msg) in self._pending and self._pending[type(msg)]:
            fut = self._pending[type(msg)].pop(0)
            if not fut.done():
                fut.set_result(msg)

    def _apply(self, st: ReqState, out: ReqOutput) -> None:
        finished = out.finish_reason is not None
        st.output_ids.extend(out.new_token_ids)
        st.text += out.text
        st.prompt_tokens, st.completion_tokens = out.prompt_tokens, out.completion_tokens
        st.cached_tokens = out.cached_tokens
        st.spec_verify_ct = out.spec_verify_ct
        if out.input_token_logprobs is not None:
            st.input_token_logprobs = out.input_token_logprobs
            st.input_top_logprobs = out.input_top_logprobs or []
            st.input_token_ids_logprobs = out.input_token_ids_logprobs or []
        st.output_token_logprobs.extend(out.output_token_logprobs)
        st.output_top_logprobs.extend(out.output_top_logprobs)
        st.output_token_ids_logprobs.extend(out.output_token_ids_logprobs)
        if finished:
            st.finish_reason = out.finish_reason
            if self.log_requests and not st.single.rid.startswith(INTERNAL_RID_PREFIX):
                logger.info("Finish: rid=%s finish_reason=%s prompt_tokens=%d "
                            "completion_tokens=%d cached_tokens=%d output=%s", st.single.rid,
                            out.finish_reason, st.prompt_tokens, st.completion_tokens,
                            st.cached_tokens, _clip(repr(st.text or st.output_ids)))
            if st.abandoned and self.states.get(st.single.rid) is st:
                del self.states[st.single.rid]      # (its caller is gone: the rid is free)
        if self.metrics is not None and not st.single.rid.startswith(INTERNAL_RID_PREFIX):
            self._observe(st, out, finished)
        st.updated.set()

    def _observe(self, st: ReqState, out: ReqOutput, finished: bool) -> None:
        now = time.perf_counter()
        if out.new_token_ids:
            if st.last_output is None:
                st.first_output = now
                self.metrics.first_token(now - st.created)
            else:
                self.metrics.next_tokens(now - st.last_output, len(out.new_token_ids))
            st.last_output = now
        if finished and (_refused(st.finish_reason) or st.refused_with_request):
            return    # (never served: an invalid request, or a full queue's "retry later")
        if finished:
            self.metrics.finished(
                now - st.created, st.prompt_tokens, st.completion_tokens, st.cached_tokens,
                first_token_s=None if st.first_output is None else st.first_output - st.created,
                aborted=st.finish_reason is not None and st.finish_reason.type == "abort")

    def has_unfinished(self) -> bool:
        return any(not st.finished for st in list(self.states.values()))

    def mark_dead(self, reason: str) -> None:
        """The scheduler is gone: fail every request instead of letting callers hang."""
        self.dead_reason = reason
        for rid, st in list(self.states.items()):
            if not st.finished:
                st.finish_reason = FinishReason("abort", message=f"engine died: {reason}",
                                                status_code=503)
            if st.abandoned:
                del self.states[rid]
            st.updated.set()
        for futs in self._pending.values():
            for f in futs:
                if not f.done():
                    f.set_exception(EngineDeadError(reason))
            futs.clear()

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine is not running: {self.dead_reason}")

    # ------------------------------------------------------------------ responses

    def response(self, st: ReqState) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": st.single.rid,
            "finish_reason": st.finish_reason.to_json() if st.finish_reason else None,
            "prompt_tokens": st.prompt_tokens or len(st.prompt_ids),
            "completion_tokens": st.completion_tokens,
            "cached_tokens": st.cached_tokens,
            "e2e_latency": time.perf_counter() - st.created,
        }
        if self.ready.speculative:   # verify passes; completion_tokens / it = accept length
            meta["spec_verify_ct"] = st.spec_verify_ct
        if st.single.return_logprob:
            meta["input_token_logprobs"] = self._lp(st, st.input_token_logprobs)
            meta["output_token_logprobs"] = self._lp(st, st.output_token_logprobs)
            if st.single.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [None if t is None else self._lp(st, t)
                                              for t in st.input_top_logprobs]
                meta["output_top_logprobs"] = [self._lp(st, t) for t in st.output_top_logprobs]
            if st.single.token_ids_logprob:
                meta["input_token_ids_logprobs"] = [None if t is None else self._lp(st, t)
                                                    for t in st.input_token_ids_logprobs]
                meta["output_token_ids_logprobs"] = [self._lp(st, t)
                                                     for t in st.output_token_ids_logprobs]
        out = {"text": st.text, "output_ids": list(st.output_ids), "meta_info": meta}
        return out if self.tokenizer is not None else without_text(out)

    def _lp(self, st: ReqState, entries) -> list[list]:
        if not st.return_text_in_logprobs:
            return [[lp, tid, None] for lp, tid in entries]
        return [[lp, tid, self.tokenizer.decode([tid])] for lp, tid in entries]

    # ------------------------------------------------------------------ control

    async def _ask(self, msg: Any, answer: type) -> Any:
        self._check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._pending[answer].append(fut)
        self.send(msg)
        return await fut

    async def flush_cache(self) -> FlushCacheResult:
        return await self._ask(FlushCacheReq(), FlushCacheResult)

    async def update_weights_from_disk(self, req: UpdateWeightsReq,
                                       weight_version: str | None = None
                                       ) -> UpdateWeightsResult:
        """Waits for the requests running now (the scheduler admits none meanwhile); on
        success the model directory the server reports is the new one, and its label
        `weight_version` where one is given."""
        result = await self._ask(req, UpdateWeightsResult)
        if result.success:
            self.ready.model_path = result.model_path
            if weight_version is not None:
                self.weight_version = weight_version
        return result

    async def get_stats(self) -> SchedulerStats:
        return await self._ask(GetStatsReq(), SchedulerStats)

    async def profile(self, req: ProfileReq) -> ProfileResult:
        return await self._ask(req, ProfileResult)

    def abort(self, rid: str) -> None:
        """A client's abort: `rid` and the sequences expanded from it. Those not sent to the
        scheduler yet (n > 1 samples waiting for their shared prompt) end here."""
        self.send(AbortReq(rid, expanded=True))
        for st in list(self.states.values()):
            if (not st.submitted and not st.finished
                    and (st.single.rid == rid or expanded_from(st.single.rid, rid))):
                st.finish_reason = FinishReason("abort", message="aborted")
                st.updated.set()


def _clip(text: str, limit: int = 2048) -> str:
    """A logged prompt or output, cut to `limit` characters (--log-requests)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _refused(fr: FinishReason | None) -> bool:
    """Whether the scheduler refused the request instead of serving it (HTTP 400 or 429)."""
    return fr is not None and fr.status_code in (400, 429)


def _raise_if_rejected(st: ReqState) -> None:
    """A request the scheduler refused as invalid (e.g. a grammar that does not compile) is a
    ValueError for the caller (HTTP 400), not a finished generation."""
    fr = st.finish_reason
    if fr is not None and fr.status_code == 400:
        raise ValueError(fr.message or "invalid request")
    if fr is not None and fr.status_code == 429:
        raise RequestRefusedError(fr.message or "too many requests", 429)
