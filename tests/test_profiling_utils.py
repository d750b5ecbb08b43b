"""The small pieces behind the start-up report and the profiler's GPU figures: PhaseTimer
(utils/phases.py) and busy_and_span (utils/gpu_activity.py), which turns a profiler's kernel
intervals into the busy time `bench headline` divides the end-to-end time by."""

from __future__ import annotations

import time

import pytest

from radixlm.utils.gpu_activity import busy_and_span, gaps_by_neighbours
from radixlm.utils.phases import SPAWN_TIME_ENV, PhaseTimer, seconds_since_spawn


def test_busy_counts_overlapping_kernels_once():
    # [0, 10) and [5, 12) overlap: 12; [20, 25) alone: 5; [21, 22) inside it: nothing more.
    busy, span = busy_and_span([(20, 25), (0, 10), (5, 12), (21, 22)])
    assert busy == 17 and span == 25


def test_busy_and_span_edges():
    assert busy_and_span([]) == (0.0, 0.0)
    assert busy_and_span([(3, 7)]) == (4, 4)
    # A kernel starting later but ending last sets the span's end, not the last one sorted.
    assert busy_and_span([(0, 100), (10, 20)]) == (100, 100)
    # Touching intervals: no gap between them.
    assert busy_and_span([(0, 5), (5, 9)]) == (9, 9)


def test_gaps_by_neighbours():
    events = [(0, 10, "a"), (2, 4, "inside"), (12, 20, "b"), (30, 31, "c"), (40, 45, "a"),
              (55, 60, "b")]
    totals, short = gaps_by_neighbours(events, long_gap=3.0)
    # 10 -> 12 is short; "inside" ended before "a" did, so the gap is after "a".
    assert short == 2
    assert totals == {("b", "c"): (10, 1), ("c", "a"): (9, 1), ("a", "b"): (10, 1)}
    assert gaps_by_neighbours([]) == ({}, 0.0)


def test_phase_timer_accumulates_in_order():
    timer = PhaseTimer()
    with timer.phase("a"):
        time.sleep(0.01)
    with timer.phase("b"):
        pass
    with timer.phase("a"):
        time.sleep(0.01)
    assert list(timer.seconds) == ["a", "b"]
    assert timer.seconds["a"] >= 0.02 and timer.seconds["b"] < timer.seconds["a"]
    other = PhaseTimer()
    with other.phase("c"):
        pass
    timer.merge(other)
    assert list(timer.seconds) == ["a", "b", "c"]
    assert "a " in timer.summary() and timer.summary().count(" s") == 3


def test_phase_timer_counts_a_failing_phase():
    timer = PhaseTimer()
    with pytest.raises(RuntimeError):
        with timer.phase("weights"):
            raise RuntimeError("no file")
    assert "weights" in timer.seconds


def test_seconds_since_spawn(monkeypatch):
    monkeypatch.delenv(SPAWN_TIME_ENV, raising=False)
    assert seconds_since_spawn() is None
    monkeypatch.setenv(SPAWN_TIME_ENV, repr(time.time() - 2.0))
    assert 1.9 < seconds_since_spawn() < 10
    monkeypatch.setenv(SPAWN_TIME_ENV, "not a time")
    assert seconds_since_spawn() is None


def test_profiler_survives_a_trace_it_cannot_write(tmp_path):
    """A trace that cannot be written (its directory removed meanwhile) is an error answer, not
    an exception out of the scheduler loop; the profiler can start again afterwards, and two
    traces stopped within a second keep distinct names."""
    import shutil

    import torch

    from radixlm.managers.messages import ProfileReq
    from radixlm.scheduler.profiler import StepProfiler
    prof = StepProfiler(torch.device("cpu"))
    gone = tmp_path / "gone"
    assert prof.handle(ProfileReq("start", output_dir=str(gone), activities=["CPU"])).success
    torch.ones(4).sum()
    shutil.rmtree(gone)
    result = prof.handle(ProfileReq("stop"))
    assert not result.success and "no trace was written" in result.message
    assert not prof.active
    paths = []
    for _ in range(2):
        assert prof.handle(ProfileReq("start", output_dir=str(tmp_path),
                                      activities=["CPU"])).success
        torch.ones(4).sum()
        stopped = prof.handle(ProfileReq("stop"))
        assert stopped.success
        paths.append(stopped.trace_path)
    assert paths[0] != paths[1] and all((tmp_path / p.split("/")[-1]).exists() for p in paths)
