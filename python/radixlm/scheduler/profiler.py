"""/start_profile and /stop_profile: the torch profiler over the scheduler's steps.

The profiler runs in the scheduler process (where the model runs), from a start request to a
stop request or for `num_steps` scheduler steps, and writes a Chrome trace (open it in
chrome://tracing or Perfetto) named `<time in ms>-<pid>-<n>-TP-<rank>.trace.json.gz` in the
output directory.
The stop answer also says how busy the GPU was over the window (kernel time with overlapping
kernels counted once, and the span from the first kernel to the last): `radixlm bench headline`
compares that with the end-to-end time of the same request.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from radixlm.managers.messages import ProfileReq, ProfileResult
from radixlm.utils.gpu_activity import busy_and_span, kernel_intervals

logger = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU")


def default_output_dir() -> str:
    return (os.environ.get("RADIXLM_TORCH_PROFILER_DIR")
            or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp")


class StepProfiler:
    def __init__(self, device: torch.device, tp_rank: int = 0):
        self.device = device
        self.tp_rank = tp_rank
        self._prof = None
        self._req: ProfileReq | None = None
        self._steps = 0
        self._out_dir = default_output_dir()
        self._written = 0                  # traces written (part of their names)

    @property
    def active(self) -> bool:
        return self._prof is not None

    def handle(self, req: ProfileReq) -> ProfileResult:
        if req.action == "start":
            return self.start(req)
        if req.action == "stop":
            return self.stop()
        return ProfileResult(False, f"unknown profile action {req.action!r}")

    def start(self, req: ProfileReq) -> ProfileResult:
        if self._prof is not None:
            return ProfileResult(False, "the profiler is already running (/stop_profile first)")
        on_gpu = self.device.type == "cuda"
        names = req.activities if req.activities is not None else (
            ["CPU", "GPU"] if on_gpu else ["CPU"])
        bad = [a for a in names if a not in ACTIVITIES]
        if bad or not names:
            return ProfileResult(False, f"activities: {bad or names} not supported; use a "
                                        f"non-empty subset of {list(ACTIVITIES)}")
        if "GPU" in names and not on_gpu:
            return ProfileResult(False, "activities: GPU asked, but this server runs on "
                                        f"{self.device.type}")
        if req.num_steps is not None and req.num_steps < 1:
            return ProfileResult(False, "num_steps must be >= 1")
        out_dir = req.output_dir or default_output_dir()
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            return ProfileResult(False, f"output_dir {out_dir!r}: {e}")
        kinds = {"CPU": torch.profiler.ProfilerActivity.CPU,
                 "GPU": torch.profiler.ProfilerActivity.CUDA}
        try:
            prof = torch.profiler.profile(activities=[kinds[a] for a in names],
                                          with_stack=req.with_stack,
                                          record_shapes=req.record_shapes)
            prof.start()
        except Exception as e:   # e.g. another profiler active in this process
            return ProfileResult(False, f"the profiler did not start: {type(e).__name__}: {e}")
        self._prof, self._req, self._steps = prof, req, 0
        self._out_dir = out_dir
        logger.info("profiling %s, trace to %s", "+".join(names), out_dir)
        return ProfileResult(True, "Start profiling.")

    def on_step(self) -> None:
        """Called after each scheduler step that launched work."""
        if self._prof is None:
            return
        self._steps += 1
        if self._req.num_steps is not None and self._steps >= self._req.num_steps:
            result = self.stop()
            log = logger.info if result.success else logger.error
            log("profiler stopped after %d steps: %s", result.steps, result.message)

    def stop(self) -> ProfileResult:
        """Stop and write the trace. Never raises: a trace that cannot be written (its
        directory removed, a full disk) is an error answer, and the scheduler keeps serving."""
        if self._prof is None:
            return ProfileResult(False, "the profiler is not running (/start_profile first)")
        prof, self._prof = self._prof, None
        # Milliseconds, the process and a count: traces stopped at the same moment keep
        # distinct names, also those of several servers on one machine (a router's
        # /stop_profile reaches every worker at once).
        self._written += 1
        name = (f"{time.time() * 1000:.0f}-{os.getpid()}-{self._written}-TP-{self.tp_rank}"
                f".trace.json.gz")
        path = os.path.join(self._out_dir, name)
        try:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            prof.stop()
            intervals = kernel_intervals(prof) if self.device.type == "cuda" else []
            prof.export_chrome_trace(path)
        except Exception as e:
            logger.exception("profiler: no trace written")
            return ProfileResult(False, f"the profiler stopped, but no trace was written to "
                                        f"{path}: {type(e).__name__}: {e}", steps=self._steps)
        busy = span = None
        if intervals:
            busy_us, span_us = busy_and_span(intervals)
            busy, span = busy_us / 1e6, span_us / 1e6
        return ProfileResult(True, f"Stop profiling. Trace written to {path}.", trace_path=path,
                             gpu_busy_s=busy, gpu_span_s=span, num_kernels=len(intervals),
                             steps=self._steps)
