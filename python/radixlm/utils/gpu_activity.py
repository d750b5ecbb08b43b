"""How busy the GPU was over a torch profiler window: kernel time with overlapping kernels
counted once (their union), against the span from the first kernel's start to the last one's
end. `span - busy` is time the device waited, mostly for the host."""

from __future__ import annotations

from typing import Iterable

import torch


def kernel_intervals(prof) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every device event a torch profiler recorded."""
    return [(start, end) for start, end, _ in named_device_events(prof)]


def busy_and_span(intervals: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(union of the intervals, last end - first start), in the intervals' unit; (0, 0) for
    none."""
    spans = sorted(intervals)
    if not spans:
        return 0.0, 0.0
    busy, (cur_start, cur_end) = 0.0, spans[0]
    last_end = cur_end
    for start, end in spans[1:]:
        last_end = max(last_end, end)
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy, last_end - spans[0][0]


def named_device_events(prof) -> list[tuple[float, float, str]]:
    """(start, end, name) in microseconds of every device event (kernels, copies) a torch
    profiler recorded."""
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def gaps_by_neighbours(events: Iterable[tuple[float, float, str]], long_gap: float = 3.0
                       ) -> tuple[dict[tuple[str, str], tuple[float, int]], float]:
    """Where the device waited. Walking the events in start order (overlapping ones merged),
    every gap longer than `long_gap` is summed under (the name of the event that ended last
    before it, the name of the event after it), with a count; shorter gaps are summed into
    one number. Returns ({(before, after): (total, count)}, total of the short gaps)."""
    ordered = sorted(events)
    totals: dict[tuple[str, str], tuple[float, int]] = {}
    short = 0.0
    if not ordered:
        return totals, short
    _, cur_end, cur_name = ordered[0]
    for start, end, name in ordered[1:]:
        gap = start - cur_end
        if gap > long_gap:
            total, count = totals.get((cur_name, name), (0.0, 0))
            totals[(cur_name, name)] = (total + gap, count + 1)
        elif gap > 0:
            short += gap
        if end > cur_end:
            cur_end, cur_name = end, name
    return totals, short
