"""How busy the GPU was over a torch profiler window: kernel time with overlapping kernels
counted once (their union), against the span from the first kernel's start to the last one's
end. `span - busy` is time the device waited, mostly for the host."""

from __future__ import annotations

from typing import Iterable

import torch


def kernel_intervals(prof) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every device event a torch profiler recorded."""
    return [(e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


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
