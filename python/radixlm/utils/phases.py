"""Wall-clock time per start-up phase (weights, KV cache, CUDA graphs, ...), for the log line
and `/get_server_info` that say where a server's start-up went."""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch


# Set by the parent when it starts a scheduler process: the child counts the interpreter's own
# start-up (Python, the modules imported before its first phase) from it.
SPAWN_TIME_ENV = "RADIXLM_SPAWN_TIME"


def seconds_since_spawn() -> float | None:
    value = os.environ.get(SPAWN_TIME_ENV)
    try:
        return max(time.time() - float(value), 0.0) if value else None
    except ValueError:
        return None


class PhaseTimer:
    """Seconds per named phase, in the order the phases first ran. On CUDA each phase ends with
    a device synchronisation, so the work it queued counts towards it, not the next phase."""

    def __init__(self, device: "torch.device | None" = None):
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device is not None and self.device.type == "cuda":
                import torch     # (not at the top: the scheduler times its own torch import)
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def merge(self, other: "PhaseTimer") -> None:
        for name, s in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + s

    def summary(self) -> str:
        return ", ".join(f"{name} {s:.2f} s" for name, s in self.seconds.items())
