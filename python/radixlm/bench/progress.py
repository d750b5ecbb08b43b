"""Progress bars for benchmarks whose timed work is one long call (a whole dataset in one
`Engine.generate`, one batched `/generate`): a thread reads the engine's count of generated
tokens twice a second and draws it against the tokens the call will produce. Reading the count
is one small control message to the scheduler, negligible next to the work measured."""

from __future__ import annotations

import sys
import threading
from typing import Callable

from tqdm import tqdm


class TokenProgress:
    """`with TokenProgress(total, read): long_call()`; `read()` returns the engine's running
    total of generated tokens (the bar shows the difference from when it started)."""

    def __init__(self, total: int, read: Callable[[], int], desc: str = "output tokens",
                 interval_s: float = 0.5):
        self.total, self.read, self.desc, self.interval_s = total, read, desc, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _safe_read(self) -> int | None:
        try:
            return self.read()
        except Exception:   # a progress bar never fails the benchmark
            return None

    def __enter__(self) -> "TokenProgress":
        base = self._safe_read()
        if base is None:
            return self
        bar = tqdm(total=self.total, desc=self.desc, unit="tok", file=sys.stderr,
                   mininterval=self.interval_s, dynamic_ncols=True)

        def poll() -> None:
            while not self._stop.wait(self.interval_s):
                now = self._safe_read()
                if now is not None:
                    bar.n = min(now - base, self.total)
                    bar.refresh()
            bar.close()

        self._thread = threading.Thread(target=poll, name="bench-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
