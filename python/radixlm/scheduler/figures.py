"""The scheduler's figures: the SchedulerStats snapshot (`get_stats`, /metrics, the log line)
and SGLang's periodic "decode batch" log line. Read-only views of a Scheduler (typed Any: the
scheduler imports this module)."""

from __future__ import annotations

import logging
from typing import Any

from radixlm.managers.messages import SchedulerStats

logger = logging.getLogger("radixlm.scheduler.scheduler")   # (the loop's log, as before)


def scheduler_stats(sched: Any) -> SchedulerStats:
    alloc = sched.kv.allocator
    total = alloc.total_size
    in_use = total - sched.kv.available_size()
    return SchedulerStats(
        num_running_reqs=len(sched.running) + (1 if sched.chunked_req else 0),
        num_waiting_reqs=len(sched.waiting), max_total_num_tokens=total,
        available_kv_tokens=alloc.available_size(),
        evictable_kv_tokens=sched.prefix_cache.evictable_size(),
        protected_kv_tokens=sched.prefix_cache.protected_size(),
        token_usage=in_use / total if total else 0.0,
        cache_hit_rate=(sched.cached_tokens_total / sched.prompt_tokens_total
                        if sched.prompt_tokens_total else 0.0),
        num_retractions=sched.admission.num_retractions,
        new_token_ratio=sched.admission.ratio.value,
        overlapped_steps=sched.overlapped_steps,
        decode_steps=sched.decode_steps, extend_steps=sched.extend_steps,
        grammar_rejections=sched.grammar_rejections,
        grammar_device_rows=sched.step_sampling.device_rows_sampled,
        short_prefills=sched.short_prefills.count,
        generated_tokens_total=sched.gen_throughput.total_tokens,
        last_gen_throughput=sched.gen_throughput.read(),
        weight_bytes=sched.runner.weight_bytes, kv_cache_bytes=sched.runner.kv_pool.nbytes,
        **(sched.speculator.stats() if sched.speculator else {}),
        **_hicache_stats(sched.prefix_cache))


def _hicache_stats(cache: Any) -> dict[str, int]:
    return {f"hicache_{name}": getattr(cache, name, 0)
            for name in ("loaded_tokens", "backed_up_tokens", "storage_hit_tokens",
                         "storage_prefetched_tokens")}


def log_decode_batch(sched: Any) -> None:
    st = scheduler_stats(sched)   # (the throughput window closes here: a rate over the interval)
    accept = f"accept len: {st.spec_accept_length:.2f}, " if st.spec_verify_steps else ""
    logger.info("decode batch: #running-req: %d, token usage: %.2f, %sgen throughput "
                "(token/s): %.2f, #queue-req: %d", st.num_running_reqs, st.token_usage,
                accept, st.last_gen_throughput, st.num_waiting_reqs)
