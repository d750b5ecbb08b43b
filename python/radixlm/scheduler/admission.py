"""Admission: which waiting requests the next prefill takes, and which running requests leave
when the next decode step's KV does not fit (retraction).

The scheduler owns the queues (`waiting`, `running`, the chunked request) and hands them in;
`Admission` owns the rules over them: the policy's order, the token budget (PrefillAdder with
the new-token ratio's reservation for future decode tokens), the chunk size, and the ratio's
reaction to a retraction.
"""

from __future__ import annotations

import logging
from typing import Callable

from radixlm.core.forward_batch import ForwardMode
from radixlm.managers.messages import FinishReason
from radixlm.mem_cache.kv_cache_manager import KVCacheManager
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.decode import (NewTokenRatio, decode_tokens_needed,
                                      pick_retraction_victim)
from radixlm.scheduler.policy import SchedulePolicy
from radixlm.scheduler.prefill import AddResult, PrefillAdder
from radixlm.scheduler.request import Req
from radixlm.scheduler.schedule_batch import ScheduleBatch

logger = logging.getLogger("radixlm.scheduler.scheduler")   # (the loop's log, as before)

CPU_DEFAULT_CHUNK = 4096
GPU_DEFAULT_CHUNK = 8192


class Admission:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_running_requests: int,
                 on_gpu: bool):
        self.kv = kv
        self.policy = SchedulePolicy(config.schedule_policy, kv.prefix_cache, config.random_seed)
        self.ratio = NewTokenRatio.create(config.schedule_conservativeness)
        self.max_prefill_tokens = config.max_prefill_tokens
        chunk = config.chunked_prefill_size
        if chunk is None:
            chunk = GPU_DEFAULT_CHUNK if on_gpu else CPU_DEFAULT_CHUNK
        self.chunk_size: int | None = None if chunk == -1 else chunk
        self.max_running_requests = max_running_requests
        self.num_retractions = 0

    def on_arrival(self, req: Req, waiting: list[Req], running: list[Req], chunked: Req | None,
                   context_len: int, capacity: int, max_queued: int | None
                   ) -> FinishReason | None:
        """Why a request that just arrived is refused, or None: it may join `waiting`, its
        budget clamped, as SGLang's, to what the pool holds besides its prompt (so that a
        request alone never outgrows the pool). `capacity`: tokens one request can hold.
        --max-queued-requests counts the requests waiting beyond the running batch's free
        places: those the next step admits are not queued behind anything (a request of n
        sequences on an idle server fits while n <= running + queued places)."""
        if req.prompt_len >= context_len:
            return FinishReason("abort", message=f"prompt of {req.prompt_len} tokens does not "
                                f"fit the context length {context_len}", status_code=400)
        if req.prompt_len + 1 > capacity:
            return FinishReason("abort", message=f"prompt of {req.prompt_len} tokens does not "
                                f"fit the KV cache ({capacity} tokens)", status_code=400)
        if max_queued is not None:
            free = self.max_running_requests - len(running) - (chunked is not None)
            if len(waiting) >= max_queued + max(0, free):
                return FinishReason("abort", message=f"the request queue is full "
                                    f"({max_queued} waiting beyond the running batch, "
                                    f"--max-queued-requests); retry later", status_code=429)
        params = req.sampling_params
        params.max_new_tokens = min(params.max_new_tokens, capacity - req.prompt_len)
        return None

    def prefill_batch(self, waiting: list[Req], running: list[Req], chunked: Req | None
                      ) -> tuple[ScheduleBatch | None, Req | None]:
        """The next prefill batch, or None, and the request whose prompt is now chunked (the
        one handed in, continued, or a newly admitted one). Admitted requests leave `waiting`.
        Requests with a grammar still compiling are not considered."""
        if not waiting and chunked is None:
            return None, None
        kv = self.kv
        slots = min(kv.req_to_token_pool.available_size(),
                    self.max_running_requests - len(running) - (1 if chunked else 0))
        adder = PrefillAdder(kv.prefix_cache, kv.allocator, running, self.ratio.value,
                             self.max_prefill_tokens, self.chunk_size, slots,
                             share_prefixes=kv.radix)
        still_chunked = None
        if chunked is not None and adder.add_chunked(chunked) is AddResult.CHUNKED:
            still_chunked = chunked
        if still_chunked is None:
            ready = [r for r in waiting if r.grammar_future is None]
            for req in self.policy.order(ready):
                result = adder.add(req)
                if result is AddResult.NO_ROOM:
                    break
                if result is AddResult.DEFERRED:
                    continue
                waiting.remove(req)
                if result is AddResult.CHUNKED:
                    still_chunked = req
                    break
        if not adder.added:
            return None, still_chunked
        return ScheduleBatch(adder.added, ForwardMode.EXTEND), still_chunked

    def make_room_for_decode(self, running: list[Req], waiting: list[Req],
                             finish: Callable[[Req, FinishReason], None]) -> None:
        """Retract running requests (back to `waiting`, their KV to the prefix cache) until the
        next decode step's tokens fit; a request alone that does not fit is ended."""
        retracted = False
        while running:
            need = decode_tokens_needed(running, self.kv.page_size)
            if need <= self.kv.available_size():
                break
            if len(running) == 1:
                # Nothing left to retract: this request alone has outgrown the pool (its budget
                # was clamped to the pool at arrival, so only forced tokens past it, e.g. a
                # jump-forward's, get here). It ends as at a length limit, its output kept.
                alone = running.pop()
                finish(alone, FinishReason("length", length=len(alone.output_ids)))
                break
            victim = pick_retraction_victim(running)
            running.remove(victim)
            self.kv.prefix_cache.cache_finished_req(victim)
            victim.reset_kv()
            victim.num_retractions += 1
            waiting.append(victim)
            self.num_retractions += 1
            retracted = True
        if retracted:
            self.ratio.after_retraction(running)
            logger.info("retracted requests; %d running, %d waiting, new_token_ratio %.2f",
                        len(running), len(waiting), self.ratio.value)
