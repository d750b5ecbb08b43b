"""The GPU benchmarks' timing helpers, run on the CPU with the CUDA-graph timer replaced: their
calls into `bench/common.py` must match its signatures (a changed signature once broke
`bench gemv` and `bench quant --parts gemv` unnoticed: both time only on a GPU)."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_graph_timer(monkeypatch):
    """graph_seconds_per_call replaced by one that calls fn `graph_calls` times and reports
    1 ms per call; returns the list of (graph_calls, repeats) it was asked for."""
    import radixlm.bench.fused_ops as fused_ops
    asked = []

    def fake(fn, calls_in_fn=1, graph_calls=20, repeats=10):
        for _ in range(graph_calls):
            fn()
        asked.append((graph_calls, repeats))
        return 1e-3

    monkeypatch.setattr(fused_ops, "graph_seconds_per_call", fake)
    return asked


def test_gemv_timed_over_copies_cycles_the_copies(fake_graph_timer):
    from radixlm.bench.gemv import timed_over_copies
    seen = []
    us = timed_over_copies(seen.append, ["a", "b", "c"])
    assert us == pytest.approx(1000.0)
    assert seen[:6] == ["a", "b", "c", "a", "b", "c"] and len(seen) == 8   # at least 8 calls
    assert fake_graph_timer == [(8, 20)]


def test_quant_timed(fake_graph_timer):
    from radixlm.bench.quant import _timed
    calls = []
    assert _timed(lambda: calls.append(1), calls=5) == pytest.approx(1000.0)
    assert len(calls) == 5 and fake_graph_timer == [(5, 20)]
