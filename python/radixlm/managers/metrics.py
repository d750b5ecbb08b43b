"""Prometheus metrics (--enable-metrics), named as SGLang names them so dashboards carry over.

Request-level figures (latencies, token counts) are observed by the tokenizer manager as outputs
arrive; scheduler-level figures (running / queued requests, token usage, cache hit rate) are read
from the scheduler when /metrics is scraped.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixlm.managers.messages import SchedulerStats

PROMPT_WINDOW_S = 10.0

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class MetricsCollector:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()  # per server: no global state between tests
        labels = ["model_name"]
        r = self.registry
        self.model_name = model_name
        self.num_running = Gauge("sglang:num_running_reqs", "Running requests", labels, registry=r)
        self.num_queue = Gauge("sglang:num_queue_reqs", "Queued requests", labels, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "Fraction of the KV pool in use",
                                 labels, registry=r)
        self.cache_hit_rate = Gauge("sglang:cache_hit_rate", "Prefix cache hit rate (tokens)",
                                    labels, registry=r)
        # (both the same for every reader: a scrape resets nothing)
        self.gen_throughput = Gauge("sglang:gen_throughput",
                                    "Generation throughput (tokens/s): the scheduler's "
                                    "last_gen_throughput", labels, registry=r)
        self.prompt_throughput = Gauge("sglang:prompt_throughput",
                                       f"Prompt throughput (tokens/s) of the requests that "
                                       f"finished in the last {PROMPT_WINDOW_S:g} s",
                                       labels, registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens processed", labels,
                                     registry=r)
        self.spec_accept_length = Gauge("sglang:spec_accept_length",
                                        "Speculative decoding: tokens per verify step",
                                        labels, registry=r)
        self.spec_accept_rate = Gauge("sglang:spec_accept_rate",
                                      "Speculative decoding: accepted / proposed draft tokens",
                                      labels, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Tokens generated", labels,
                                         registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "Prompt tokens served from cache",
                                     labels, registry=r)
        self.num_requests = Counter("sglang:num_requests", "Finished requests", labels,
                                    registry=r)
        self.num_aborted = Counter("sglang:num_aborted_requests", "Requests that ended aborted",
                                   labels, registry=r)
        self.num_used_tokens = Gauge("sglang:num_used_tokens",
                                     "KV cache tokens in use by running requests", labels,
                                     registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token",
                              labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Inter-token latency",
                             labels, buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency",
                             labels, buckets=_LATENCY_BUCKETS, registry=r)
        # (e2e - time to first token) / (tokens - 1), per request of two tokens or more
        self.tpot = Histogram("sglang:time_per_output_token_seconds", "Time per output token",
                              labels, buckets=_ITL_BUCKETS, registry=r)
        # (finish time, prompt tokens) of the requests of the last PROMPT_WINDOW_S seconds
        self._recent_prompts: deque[tuple[float, int]] = deque()

    # ------------------------------------------------------------------ request events

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def next_tokens(self, seconds: float, num_tokens: int) -> None:
        if num_tokens > 0:
            per_token = seconds / num_tokens
            for _ in range(num_tokens):
                self.itl.labels(self.model_name).observe(per_token)

    def finished(self, seconds: float, prompt_tokens: int, completion_tokens: int,
                 cached_tokens: int, first_token_s: float | None = None,
                 aborted: bool = False) -> None:
        m = self.model_name
        self.e2e.labels(m).observe(seconds)
        self.num_requests.labels(m).inc()
        if aborted:
            self.num_aborted.labels(m).inc()
        if first_token_s is not None and completion_tokens > 1:
            self.tpot.labels(m).observe((seconds - first_token_s) / (completion_tokens - 1))
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(completion_tokens)
        self.cached_tokens.labels(m).inc(cached_tokens)
        self._recent_prompts.append((time.monotonic(), prompt_tokens))
        self._forget_old_prompts()

    def _forget_old_prompts(self) -> None:
        horizon = time.monotonic() - PROMPT_WINDOW_S
        while self._recent_prompts and self._recent_prompts[0][0] < horizon:
            self._recent_prompts.popleft()

    # ------------------------------------------------------------------ scrape

    def render(self, stats: SchedulerStats) -> bytes:
        m = self.model_name
        self.num_running.labels(m).set(stats.num_running_reqs)
        self.num_queue.labels(m).set(stats.num_waiting_reqs)
        self.token_usage.labels(m).set(stats.token_usage)
        self.num_used_tokens.labels(m).set(round(stats.token_usage * stats.max_total_num_tokens))
        self.cache_hit_rate.labels(m).set(stats.cache_hit_rate)
        self.spec_accept_length.labels(m).set(stats.spec_accept_length)
        self.spec_accept_rate.labels(m).set(stats.spec_accept_rate)
        self.gen_throughput.labels(m).set(stats.last_gen_throughput)
        self._forget_old_prompts()
        self.prompt_throughput.labels(m).set(
            sum(n for _, n in self._recent_prompts) / PROMPT_WINDOW_S)
        return generate_latest(self.registry)
