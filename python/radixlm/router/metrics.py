"""The router's own Prometheus metrics (`GET /metrics` on the router): requests per worker,
policy decisions, retries and failures, tree sizes, load, and request latency."""

from __future__ import annotations

from typing import Any

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from radixlm.router.policy import Worker

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 120, 300)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radixlm_router_requests", "requests sent to each worker",
                                ["worker"], registry=r)
        self.decisions = Counter("radixlm_router_policy_decisions",
                                 "routing decisions: cache_hit, cache_miss, imbalanced, or the "
                                 "policy's name", ["decision"], registry=r)
        self.retries = Counter("radixlm_router_retries", "requests retried on another worker",
                               registry=r)
        self.failures = Counter("radixlm_router_worker_failures",
                                "requests that failed on each worker (and were retried "
                                "elsewhere if they could be)", ["worker"], registry=r)
        self.latency = Histogram("radixlm_router_request_latency_seconds",
                                 "time from a request's arrival to its last byte",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.tree_size = Gauge("radixlm_router_tree_size_chars",
                               "characters in each worker's approximate prefix tree",
                               ["worker"], registry=r)
        self.in_flight = Gauge("radixlm_router_in_flight_requests",
                               "requests in flight per worker", ["worker"], registry=r)
        self.healthy = Gauge("radixlm_router_worker_healthy", "1 if the worker is in use",
                             ["worker"], registry=r)

        # Labelled children, looked up once: a labels() call per request costs more than the
        # increment itself.
        self._children: dict[tuple[str, str], Any] = {}

    def _child(self, metric: Any, label: str) -> Any:
        key = (metric._name, label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(label)
        return child

    def count_routed(self, worker_url: str, decision: str) -> None:
        self._child(self.requests, worker_url).inc()
        self._child(self.decisions, decision).inc()

    def count_failure(self, worker_url: str) -> None:
        self._child(self.failures, worker_url).inc()

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        self._child(self.latency, endpoint).observe(seconds)

    def render(self, workers: list[Worker]) -> bytes:
        for g in (self.tree_size, self.in_flight, self.healthy):
            g.clear()
        for w in workers:
            self.tree_size.labels(w.url).set(w.tree.size)
            self.in_flight.labels(w.url).set(w.in_flight)
            self.healthy.labels(w.url).set(1 if w.healthy else 0)
        return generate_latest(self.registry)
