"""--watchdog-timeout (SGLang's flag): a scheduler whose loop makes no progress for that long
while it has work (a kernel or a collective that never returns, a deadlock) is ended, instead
of leaving every request hanging. The process exits after logging every thread's stack; the
engine then fails its requests with 503, `/health` says so, and `radixlm serve` exits so that a
supervisor restarts it.

A loop iteration that returns is progress; an idle scheduler (no requests) is never timed out.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable

logger = logging.getLogger(__name__)


def exit_stuck_process(stalled_s: float) -> None:
    """The default action: log, dump every thread's stack to stderr, exit(1) at once."""
    logger.error("the scheduler made no progress for %.0f s while it had work "
                 "(--watchdog-timeout); exiting. Stacks of its threads follow.", stalled_s)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(1)


class StepWatchdog:
    def __init__(self, timeout_s: float, has_work: Callable[[], bool],
                 on_timeout: Callable[[float], None] = exit_stuck_process,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.has_work = has_work
        self.on_timeout = on_timeout
        self.clock = clock
        self.last_progress = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """The loop went round once."""
        self.last_progress = self.clock()

    def check(self) -> bool:
        """Whether the loop is stuck now (it has work and made no progress for the timeout);
        calls on_timeout when it is."""
        if not self.has_work():
            self.last_progress = self.clock()   # (idle time is not a stall)
            return False
        stalled = self.clock() - self.last_progress
        if stalled <= self.timeout_s:
            return False
        self.on_timeout(stalled)
        return True

    def start(self) -> None:
        def watch() -> None:
            poll_s = min(max(self.timeout_s / 10, 0.05), 5.0)
            while not self._stop.wait(poll_s):
                if self.check():
                    return
        self._thread = threading.Thread(target=watch, name="radixlm-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


__all__ = ["StepWatchdog", "exit_stuck_process"]
