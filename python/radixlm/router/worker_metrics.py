"""The workers' own Prometheus metrics (SGLang's `sglang:*` names, from engines started with
--enable-metrics), merged into one set for the router's /metrics: `radixlm serve --dp-size N`
then shows what one SGLang server with N data-parallel ranks shows, so dashboards carry over.

Counters and histograms are summed over the workers (requests, tokens, latency buckets); gauges
too (running and queued requests, tokens in use, throughput), except those that are ratios
(token usage, cache hit rate, speculative acceptance), which are averaged.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# Gauges that are a ratio per worker: the merged value is their mean.
AVERAGED_GAUGES = ("sglang:token_usage", "sglang:cache_hit_rate", "sglang:spec_accept_rate",
                   "sglang:spec_accept_length")


class _Families:
    """A collector that yields fixed families (what prometheus_client renders)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_worker_metrics(texts: list[str], prefix: str = "sglang:") -> bytes:
    """The families named `prefix...` in the workers' exposition `texts`, merged as above,
    in Prometheus' text format (empty when no worker has any)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, list[float]]] = {}
    for text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:          # (not Prometheus text: a worker without --enable-metrics)
            continue
        for family in families:
            if not family.name.startswith(prefix):
                continue
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                values[family.name].setdefault(key, []).append(s.value)
    if not merged:
        return b""
    for name, family in merged.items():
        mean = family.type == "gauge" and name in AVERAGED_GAUGES
        for (sample, labels), vals in values[name].items():
            if sample.endswith("_created"):      # (a timestamp: the earliest worker's)
                value = min(vals)
            else:
                value = sum(vals) / len(vals) if mean else sum(vals)
            family.add_sample(sample, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)


__all__ = ["AVERAGED_GAUGES", "merge_worker_metrics"]
