"""The scheduler loop: receive requests, pick a batch, run it, process the results.

One step:
  1. take new requests and control messages (abort, flush cache, stats);
  2. pick the next batch: prefill first (admission.py: the policy orders the queue, the
     PrefillAdder admits), else decode the running batch (retracting requests when KV memory
     runs out);
  3. run it: ScheduleBatch -> ForwardBatch -> model -> logits -> sampler;
  4. process results: append tokens, check stop conditions, update the radix cache, send outputs.

Transport is injected (`recv`, `send`): in-process queues today, ZMQ sockets in the server.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable

import torch

import radixlm.envs as envs
from radixlm.managers.messages import (AbortReq, BatchReqOutput, FinishReason, FlushCacheReq,
                                       FlushCacheResult, GetStatsReq, ProfileReq, ReqOutput,
                                       ShutdownReq, TokenizedGenerateReq, UpdateWeightsReq,
                                       UpdateWeightsResult, expanded_from)
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.model_executor.weight_update import update_weights_from_disk
from radixlm.core.forward_batch import ForwardMode
from radixlm.model_executor.model_runner import ForwardOutput, ModelRunner
from radixlm.scheduler.admission import Admission
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.draft_model import DraftModel, speculator_for
from radixlm.scheduler.figures import log_decode_batch, scheduler_stats
from radixlm.scheduler.decode import decode_tokens_needed, rows_for_next_decode
from radixlm.scheduler.profiler import StepProfiler
from radixlm.scheduler.request import Req
from radixlm.scheduler.launched_step import LaunchedStep
from radixlm.scheduler.results import ResultProcessor, StepResult
from radixlm.scheduler.watchdog import StepWatchdog
from radixlm.scheduler.schedule_batch import ScheduleBatch
from radixlm.scheduler.short_prefill import SHORT_PREFILL_TOKENS, ShortPrefills
from radixlm.scheduler.speculation import verify_targets
from radixlm.scheduler.grammar_sampling import (MaskedResampler, plan_grammar_rows,
                                                save_unmasked_logits)
from radixlm.scheduler.grammars import RequestGrammars
from radixlm.scheduler.step_sampling import StepSampling
from radixlm.scheduler.throughput import GenThroughput
from radixlm.utils.device import to_device

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: SchedulerConfig, runner: ModelRunner, kv: KVCacheManager,
                 recv: Callable[[float | None], list[Any]], send: Callable[[Any], None],
                 tokenizer=None, draft_model: DraftModel | None = None):
        self.config = config
        self.runner = runner
        self.recv = recv
        self.send = send
        # The runner holds the KV tensors; which slots they use is the KV manager's business.
        self.kv = kv
        self.prefix_cache = self.kv.prefix_cache
        self.admission = Admission(config, kv, runner.max_running_requests,
                                   on_gpu=runner.device.type == "cuda")
        self.rng = random.Random(config.random_seed)
        self.tokenizer = tokenizer
        mc = runner.model_config
        self.draft_model = draft_model
        self.speculator = speculator_for(config, draft_model)
        # The grammar backend starts on the first constrained request (grammars.py); the
        # resampler draws rejected unmasked grammar rows again (grammar_sampling.py).
        # Grammar states live on the device unless speculation verifies on the host's grammars.
        device_grammars = self.speculator is None
        self.grammars = RequestGrammars(config, tokenizer, mc.vocab_size, mc.eos_token_ids,
                                        device_states=device_grammars)
        self.step_sampling = StepSampling(
            mc.vocab_size, mc.eos_token_ids, runner.device,
            grammar_slots=runner.last_token_ids.shape[0] if device_grammars else 0)
        resampler = MaskedResampler(runner.sampler, self.step_sampling,
                                    lambda: self.grammars.started, runner.device)
        self.results = ResultProcessor(self.kv, send, tokenizer, mc.context_len,
                                       mc.eos_token_ids,
                                       jump_forward=not config.disable_jump_forward,
                                       speculator=self.speculator, resampler=resampler)

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.arrivals = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.gen_throughput = GenThroughput()
        self.stopped = False
        self.check_invariants = envs.check_invariants()
        self.overlap = (not config.disable_overlap_schedule
                        and (runner.device.type == "cuda" or envs.overlap_on_cpu()))
        if self.speculator is not None:   # (the plain loop: every step waits for its results)
            self.speculator.policy.times.plain_waits = not self.overlap
        self.pending: LaunchedStep | None = None  # overlap: the step whose results are unread
        # The batch being launched: work while its forward runs (its requests are in neither
        # queue then), so that the watchdog times a stuck forward of the only batch.
        self.launching: ScheduleBatch | None = None
        # A prefill of at least this many new tokens overlaps the next prefill (its GPU time
        # hides the host's work for the next); a smaller one is processed first.
        self.overlap_prefill_min_tokens = envs.overlap_prefill_min_tokens()
        self.overlapped_steps = 0
        self.grammar_rejections = 0   # unmasked constrained tokens sampled again under the mask
        self.decode_steps = self.extend_steps = 0     # launched since start
        # Jump-forward rows beyond the largest CUDA graph wait a step (an eager step costs more).
        self.max_decode_rows: int | None = runner.max_graph_batch_size
        # Prefills of at most this many new tokens ride in the decode step (short_prefill.py);
        # a draft model's KV follows the target's extend steps, so not with one.
        limit = envs.short_prefill_tokens()
        if limit is None:
            limit = SHORT_PREFILL_TOKENS if self.max_decode_rows is not None else 0
        self.short_prefills = ShortPrefills(limit if self.draft_model is None else 0)
        self.profiler = StepProfiler(runner.device, runner.tp.rank)
        # /update_weights_from_disk: done once the running requests finish; none is admitted
        # meanwhile (model_executor/weight_update.py)
        self.weight_update: UpdateWeightsReq | None = None

    # ------------------------------------------------------------------ loop

    def run_forever(self) -> None:
        # --watchdog-timeout: a loop stuck with work to do ends the process (watchdog.py)
        watchdog = StepWatchdog(self.config.watchdog_timeout, lambda: self.has_work)
        watchdog.start()
        try:
            while not self.stopped:
                self.step(block=True)
                watchdog.beat()
        finally:
            watchdog.stop()

    def step(self, block: bool = False) -> bool:
        """One scheduler iteration. Returns whether a batch was launched.

        Plain loop: launch a step, wait for it, process its results. Overlap loop: launch step
        N+1, then process step N while N+1 runs on the device; step N+1's input tokens are read
        on the device (ModelRunner.last_token_ids), and stop conditions found while processing
        N end their requests one step late (the token N+1 computed for them is dropped).

        Deferred sampling (overlap, a decode batch whose sampling reads the outputs: rows under
        a grammar mask, penalties): N+1's forward is launched first, then N is processed, then
        N+1's grammar masks and penalties are built from N's tokens and N+1 is sampled. The
        host's mask filling runs while the GPU runs N+1's forward.
        """
        idle = not self.has_work
        for msg in self.recv(0.05 if (block and idle) else 0.0):
            self.handle_message(msg)
        if self.weight_update is not None and not (self.running or self.chunked_req
                                                   or self.pending):
            self._update_weights()
        if self.pending is not None and self._must_process_before_scheduling():
            self._process_pending(waited=True)
        batch = self.next_batch()
        launched = None
        if batch is not None:
            if self.pending is not None:
                self.overlapped_steps += 1
            self.launching = batch
            try:
                if self._defers_sampling(batch):
                    launched = self.launch_forward(batch)
                    self._process_pending(waited=False)
                    self.launch_sampling(launched)
                else:
                    launched = self.launch(batch)
            finally:
                self.launching = None
        self._process_pending(waited=launched is None)
        if launched is not None:
            if self.overlap:
                self.pending = launched
            else:
                self._apply(self.results.process(launched))
                self._timed(launched, waited=True)
        if self.check_invariants:
            self.check_memory_invariant()
        if launched is not None:
            self.profiler.on_step()
            if launched.batch.forward_mode.is_decode:
                self.decode_steps += 1
                if self.decode_steps % self.config.decode_log_interval == 0:
                    log_decode_batch(self)
            else:
                self.extend_steps += 1
        return launched is not None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req or self.pending
                    or self.launching)

    def _process_pending(self, waited: bool = True) -> None:
        """Process the pending step's results; `waited`: no later step was launched before
        them (the host waits for the GPU)."""
        if self.pending is not None:
            step, self.pending = self.pending, None
            self._apply(self.results.process(step))
            self._timed(step, waited)

    def _timed(self, step: LaunchedStep, waited: bool) -> None:
        """Speculation's step timer (scheduler/spec_policy.py), told a step was processed."""
        if self.speculator is not None:
            batch = step.batch
            self.speculator.policy.times.on_processed(
                batch.forward_mode.is_decode, batch.batch_size, bool(batch.verify_rows), waited)

    def _apply(self, result: StepResult) -> None:
        """Step 4's outcome on the scheduler's own state: finished requests leave the running
        batch (jumped ones stay: their forced tokens ride in the next decode step)."""
        self.running = [r for r in self.running if not r.finished]
        if result.next_inputs:      # verify steps: each request's last accepted token
            n = len(result.next_inputs)
            t = to_device([i for i, _ in result.next_inputs] + [t for _, t in result.next_inputs],
                          torch.int64, self.runner.device)
            self.runner.last_token_ids[t[:n]] = t[n:]
        self.prompt_tokens_total += result.prompt_tokens
        self.cached_tokens_total += result.cached_tokens
        self.grammar_rejections += result.grammar_rejections
        self.gen_throughput.add(result.generated_tokens)

    def _must_process_before_scheduling(self) -> bool:
        """The next batch can be built ahead of the pending step's results only in the steady
        decode state; anything that reads those results on the host waits for them (sampling
        that reads them waits inside the step instead: `_defers_sampling`)."""
        if self.pending.batch.verify_rows or (
                self.speculator is not None and self.speculator.may_draft(self.running)):
            # Drafts come from the text: the pending step's tokens first. Unless the pending
            # step verified chains that go on: the next one is built on the guess that it
            # accepts them all (dropped where it does not, speculation.py).
            if (self.waiting or self.chunked_req or not self.pending.batch.verify_rows
                    or not self.speculator.may_pipeline(self.pending.batch, self.running)):
                return True
        if (self.pending.batch.forward_mode.is_extend and (self.waiting or self.chunked_req)
                and self.pending.new_tokens < self.overlap_prefill_min_tokens):
            # A small prefill ends before the host could launch the next one, and its requests
            # (often whole requests: scoring, short programs) answer sooner if processed first.
            return True
        # A prefill's prompts entered the prefix cache at launch, so the next prefill can be
        # built now; a prefill's requests join the next decode batch before their first token
        # is read: the decode step takes it from ModelRunner.last_token_ids on the device.
        need = decode_tokens_needed(self.running, self.kv.page_size)
        return need > self.kv.available_size()  # retraction

    def _defers_sampling(self, batch: ScheduleBatch) -> bool:
        return (self.pending is not None and batch.forward_mode.is_decode
                and any(r.sampling_reads_output for r in batch.reqs))

    # ------------------------------------------------------------------ messages

    def handle_message(self, msg: Any) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            try:
                self.add_request(msg)
            except Exception as e:  # one bad request must not take the scheduler down
                logger.exception("rejected request %s", msg.rid)
                self.send(BatchReqOutput([ReqOutput(
                    rid=msg.rid, new_token_ids=[], prompt_tokens=len(msg.input_ids),
                    completion_tokens=0, cached_tokens=0,
                    finish_reason=FinishReason("abort", message=f"invalid request: {e}",
                                               status_code=400))]))
        elif isinstance(msg, AbortReq):
            if msg.abort_all:
                self.abort_all(shutdown=msg.shutdown)
            else:
                self.abort(msg.rid, msg.expanded)
        elif isinstance(msg, FlushCacheReq):
            self.send(self.flush_cache())
        elif isinstance(msg, UpdateWeightsReq):
            if self.weight_update is not None:
                self.send(UpdateWeightsResult(False, "superseded by a later weight update"))
            self.weight_update = msg
        elif isinstance(msg, GetStatsReq):
            self.send(scheduler_stats(self))
        elif isinstance(msg, ProfileReq):
            self.send(self.profiler.handle(msg))
        elif isinstance(msg, ShutdownReq):
            self.abort_all()
            if self.profiler.active:
                self.profiler.stop()
            self.stopped = True
        else:
            logger.warning("scheduler ignored an unknown message %r", type(msg).__name__)

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        seed = msg.sampling_params.sampling_seed
        if seed is None:
            seed = self.rng.getrandbits(62)
        req = Req.from_message(msg, seed=seed, arrival=self.arrivals)
        self.arrivals += 1
        refused = self.grammars.start_compiling(req)
        if refused is not None:
            self.results.finish(req, refused)
            return
        refused = self.admission.on_arrival(req, self.waiting, self.running, self.chunked_req,
                                            self.runner.model_config.context_len,
                                            self.kv_capacity, self.config.max_queued_requests)
        if refused is not None:
            self.results.finish(req, refused)
        else:
            self.waiting.append(req)
            if self.prefix_cache.has_slow_tier:
                self.prefix_cache.prefetch(req.fill_ids[:req.max_prefix_match()])

    @property
    def kv_capacity(self) -> int:
        """Tokens one request can hold in the pool (a page is kept back for rounding)."""
        return self.runner.max_total_num_tokens - self.kv.page_size

    def abort(self, rid: str, expanded: bool = False) -> None:
        """Abort request `rid`; `expanded`: also the sequences expanded from it (a batch's
        rid_0, rid_1, ..., n > 1 samples' rid-0, ...), as SGLang aborts by rid prefix."""
        def matches(req: Req) -> bool:
            return req.rid == rid or (expanded and expanded_from(req.rid, rid))

        for req in [r for r in self.waiting if matches(r)]:
            self.waiting.remove(req)
            self.results.finish(req, FinishReason("abort", message="aborted"))
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            if matches(req):
                req.to_abort = True  # released at the start of the next step

    def abort_all(self, shutdown: bool = True) -> None:
        """End every request now with finish_reason abort: the server stops (503, which tells
        a router to retry elsewhere), or a client asked (/abort_request abort_all)."""
        self._process_pending()     # (a verify step in flight holds its drafts' KV slots)
        every = self.waiting + self.running + ([self.chunked_req] if self.chunked_req else [])
        self.waiting, self.running, self.chunked_req = [], [], None
        for req in every:
            self.results.finish(req, FinishReason("abort", message="server shutting down",
                                                  status_code=503) if shutdown
                                else FinishReason("abort", message="aborted"))

    def _update_weights(self) -> None:
        req, self.weight_update = self.weight_update, None
        done = update_weights_from_disk(self.runner, req.model_path, req.load_format)
        if done.success and req.flush_cache:
            self.kv.flush()     # (the cached prefixes' KV came from the old weights)
        self.send(UpdateWeightsResult(done.success, done.message,
                                      self.runner.hf_dir if done.success else ""))

    def flush_cache(self) -> FlushCacheResult:
        self._process_pending()
        if self.has_work:
            return FlushCacheResult(False, "cannot flush the cache while requests are running")
        self.kv.flush()
        return FlushCacheResult(True)

    # ------------------------------------------------------------------ batches

    def next_batch(self) -> ScheduleBatch | None:
        self._release_aborted()
        batch = self._prefill_batch() if self.weight_update is None else None
        if batch is not None:
            self.short_prefills.take(batch.reqs, self.running, self.max_decode_rows, self.kv)
            if batch.reqs:
                return batch    # (the riders' rows are in the decode step after it)
        if not self.running:
            return None
        self._ensure_decode_memory()
        if not self.running:
            return None
        self.admission.ratio.step()
        if self.speculator is not None:
            self.speculator.plan_step(self.running, self.kv, self.max_decode_rows,
                                      self.runner.model_config.context_len)
            return ScheduleBatch(list(self.running), ForwardMode.DECODE)
        reqs = rows_for_next_decode(self.running, self.runner.model_config.context_len)
        # (none: every running request ends with its tokens in flight; they are processed next)
        return ScheduleBatch(reqs, ForwardMode.DECODE) if reqs else None

    def _release_aborted(self) -> None:
        for req in [r for r in self.running if r.to_abort]:
            self.running.remove(req)
            self.results.finish(req, FinishReason("abort", message="aborted"))
        if self.chunked_req is not None and self.chunked_req.to_abort:
            req, self.chunked_req = self.chunked_req, None
            self.results.finish(req, FinishReason("abort", message="aborted"))

    def _prefill_batch(self) -> ScheduleBatch | None:
        self.grammars.resolve(self.waiting, self.results.finish)
        batch, self.chunked_req = self.admission.prefill_batch(self.waiting, self.running,
                                                               self.chunked_req)
        return batch

    def _ensure_decode_memory(self) -> None:
        self.admission.make_room_for_decode(self.running, self.waiting, self.results.finish)

    # ------------------------------------------------------------------ run

    def launch(self, batch: ScheduleBatch) -> LaunchedStep:
        """Queue the forward pass and the sampling of one batch on the device."""
        step = self.launch_forward(batch)
        self.launch_sampling(step)
        return step

    @torch.inference_mode()
    def launch_forward(self, batch: ScheduleBatch) -> LaunchedStep:
        """Allocate the batch's KV and queue its forward pass (no sampling yet)."""
        runner = self.runner
        epochs = [r.kv_epoch for r in batch.reqs]
        if batch.forward_mode.is_extend:
            fb = batch.prepare_extend(self.kv, runner.device)
            out = runner.forward(fb, *batch.input_logprob_targets(fb))
            # The prompts' KV goes into the prefix cache now, at launch, not when the results
            # are read: the next prefill (queued behind this one on the device, so it reads
            # the KV once written) can share it and be built while this step runs.
            for req in batch.reqs:
                self.prefix_cache.cache_unfinished_req(req)
        else:
            fb = batch.prepare_decode(self.kv, runner.last_token_ids, self.max_decode_rows)
            out = runner.forward(fb)
            for req in self.short_prefills.cache_launched(self.prefix_cache):
                prompt, cached = req.count_prompt_once()   # (results.py: an extend's)
                self.prompt_tokens_total += prompt
                self.cached_tokens_total += cached
        if self.draft_model is not None:   # its KV wherever the target's is (draft_model.py)
            self.draft_model.mirror(fb)
        pool_rows = fb.req_pool_indices
        verify = (verify_targets(batch, out.next_token_logits, runner.sampler,
                                 runner.model_config.eos_token_ids, self.grammars.started)
                  if batch.verify_rows else None)
        if batch.last_rows is not None:  # jump-forward rows: each request samples its last
            out = ForwardOutput(out.next_token_logits[batch.last_rows], None)
            pool_rows = pool_rows[batch.last_rows]
        step = LaunchedStep(batch, out, batch.sample_rows(), epochs, pool_rows,
                            kv_lens=[r.kv_allocated_len for r in batch.reqs],
                            new_tokens=len(fb.positions))
        if verify is not None:
            step.attach_verify(verify)
            self._guess_inputs(batch, fb.req_pool_indices, verify.next_token_ids)
        return step

    def _guess_inputs(self, batch: ScheduleBatch, pool_indices: torch.Tensor,
                      targets: torch.Tensor) -> None:
        """A verify step's requests hold its rows as text in flight, and the device holds,
        as their next input, the target's token after their last draft: what they get if every
        draft is accepted. A step built before this one's results are read (pipelined) feeds
        that; when fewer are accepted, processing corrects it (StepResult.next_inputs) and the
        rows built on the guess are dropped."""
        chains = []
        for i, (first, n) in batch.verify_rows.items():
            batch.reqs[i].spec_inflight += n
            if batch.verify_drafts[i][1] is None:
                chains.append(first + n - 1)
        if chains and self.speculator.lookahead:
            rows = to_device(chains, torch.int64, targets.device)
            self.runner.last_token_ids[pool_indices[rows]] = targets[rows]

    @torch.inference_mode()
    def launch_sampling(self, step: LaunchedStep) -> None:
        """Queue the sampling of a launched forward. Sampling info and grammar masks are built
        from the requests as they are now: with deferred sampling, after the previous step's
        tokens were processed. Rows of requests that ended or jumped meanwhile are sampled
        unconstrained (the row shape is the graph's) and their tokens dropped."""
        batch, runner = step.batch, self.runner
        if not step.sample_rows:
            return
        reqs = [batch.reqs[i] for i in step.sample_rows]
        live = [not r.finished and not step.is_stale(i)
                for i, r in zip(step.sample_rows, reqs)]
        # Decode rows of optimistic constrained requests sample without the mask (the grammar
        # checks their tokens when they are processed: scheduler/grammar_sampling.py); rows
        # whose grammar is on the device are masked there (scheduler/grammar_states.py).
        backend = self.grammars.started
        plan = plan_grammar_rows(self.step_sampling, reqs, live, batch.forward_mode.is_decode,
                                 backend)
        step.unmasked = plan.unmasked
        info = self.step_sampling.build(reqs, plan.masked, backend, device_rows=plan.device)
        logits, pool_rows = step.out.next_token_logits, step.pool_rows
        if len(step.sample_rows) < batch.batch_size:
            rows = to_device(step.sample_rows, torch.int64, runner.device)
            logits, pool_rows = logits[rows], pool_rows[rows]
        if plan.saved_rows:
            save_unmasked_logits(step, logits, plan.saved_rows)
        tops = [r.top_logprobs_num if r.return_logprob else 0 for r in reqs]
        asked = [r.token_ids_logprob if r.return_logprob else None for r in reqs]
        step.attach_samples(runner.sample(logits, pool_rows, info, tops if any(tops) else None,
                                          plan.alternatives, asked if any(asked) else None))
        for r, alive in zip(reqs, live):
            if alive:
                r.num_pending += 1
        if batch.forward_mode.is_extend:
            self.running.extend(reqs)  # they decode from the next step on

    # ------------------------------------------------------------------ checks

    def check_memory_invariant(self) -> None:
        """free + evictable + protected + owned by requests == total (tests call this)."""
        holders = self.running + ([self.chunked_req] if self.chunked_req else [])
        # Requests of a launched step not yet processed may be in neither list (a prefill with
        # max_new_tokens 0): they own their new slots all the same.
        if self.pending is not None:
            holders += [r for r in self.pending.batch.reqs
                        if not r.finished and r.req_pool_idx is not None]
        self.kv.check_invariant((r.kv_allocated_len, len(r.prefix_indices))
                                for r in {id(r): r for r in holders}.values())

