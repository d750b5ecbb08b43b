"""The generation throughput the scheduler reports (SGLang's `last_gen_throughput`): tokens
sampled per second over the most recent window of busy steps, idle time excluded."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class GenThroughput:
    window_s: float = 1.0          # a window closes after this long or `window_steps` steps
    window_steps: int = 40
    total_tokens: int = 0
    last: float = 0.0              # tokens/s of the last closed window
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    # The open window: it starts at a step's end; the tokens of later steps fill it.
    _start: float | None = None
    _end: float = 0.0
    _tokens: int = 0
    _steps: int = 0

    def add(self, num_tokens: int) -> None:
        """Record one finished step that produced `num_tokens` tokens."""
        if num_tokens <= 0:
            return
        now = self.clock()
        self.total_tokens += num_tokens
        if self._start is None or now - self._end > self.window_s:
            # First step, or after an idle gap: the gap is not generation time.
            self._close()
            self._start = self._end = now
            return
        self._tokens += num_tokens
        self._steps += 1
        self._end = now
        if now - self._start >= self.window_s or self._steps >= self.window_steps:
            self._close()
            self._start = now

    def read(self) -> float:
        """The latest rate; a window still open (a burst shorter than a window, or a batch
        that just went idle) counts as closed."""
        self._close(keep_start=True)
        return self.last

    def _close(self, keep_start: bool = False) -> None:
        if self._start is not None and self._tokens and self._end > self._start:
            self.last = self._tokens / (self._end - self._start)
            self._tokens, self._steps = 0, 0
            if keep_start:
                self._start = self._end
