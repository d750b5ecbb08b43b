"""managers/metrics.py: the throughput gauges read the same for every scraper (a scrape
resets nothing): generation throughput is the scheduler's last_gen_throughput, prompt
throughput the prompts of the requests finished in the last PROMPT_WINDOW_S seconds."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from radixlm.managers.messages import SchedulerStats  # noqa: E402
from radixlm.managers.metrics import PROMPT_WINDOW_S, MetricsCollector  # noqa: E402


def _value(text: bytes, name: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the scrape")


def test_throughput_gauges_do_not_depend_on_scrapes(monkeypatch):
    import radixlm.managers.metrics as metrics
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    collector = MetricsCollector("m")
    stats = SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, max_total_num_tokens=100,
                           available_kv_tokens=50, evictable_kv_tokens=0,
                           protected_kv_tokens=0, token_usage=0.5, cache_hit_rate=0.0,
                           num_retractions=0, new_token_ratio=0.5, last_gen_throughput=12.5)
    collector.finished(1.0, prompt_tokens=300, completion_tokens=4, cached_tokens=0)
    collector.finished(1.0, prompt_tokens=200, completion_tokens=4, cached_tokens=0)
    scrapes = [collector.render(stats) for _ in range(3)]      # (back to back)
    for text in scrapes:
        assert _value(text, "sglang:gen_throughput") == 12.5
        assert _value(text, "sglang:prompt_throughput") == pytest.approx(500 / PROMPT_WINDOW_S)
    clock[0] += PROMPT_WINDOW_S + 1                  # those requests leave the window
    assert _value(collector.render(stats), "sglang:prompt_throughput") == 0.0
