"""Small helpers shared by the benchmarks: timing, the environment record, JSON results and the
one summary line each benchmark prints last."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


@dataclass
class Timed:
    """Wall-clock seconds of one block (`with Timed() as t: ...; t.seconds`)."""
    seconds: float = 0.0
    _start: float = field(default=0.0, repr=False)

    def __enter__(self) -> "Timed":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._start


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """Call fn once; return its result and how long it took in seconds."""
    with Timed() as t:
        result = fn()
    return result, t.seconds


def cuda_median_seconds(call: Callable[[], object], repeats: int = 10) -> float:
    """Median GPU time of `call()` in seconds, by CUDA events around each call (after one call
    to warm up)."""
    import torch

    call()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


FUSED_OPS_KNOB = "RADIXLM_DISABLE_FUSED_OPS"


class FusedOpsFallback:
    """Within the block, with on=True, layers and the sampler run their PyTorch code instead of
    their Triton kernels (the knob is read at every call); on=False forces the kernels. The
    environment's own setting comes back afterwards."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self) -> "FusedOpsFallback":
        self.old = os.environ.get(FUSED_OPS_KNOB)
        if self.on:
            os.environ[FUSED_OPS_KNOB] = "1"
        else:
            os.environ.pop(FUSED_OPS_KNOB, None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.old is None:
            os.environ.pop(FUSED_OPS_KNOB, None)
        else:
            os.environ[FUSED_OPS_KNOB] = self.old


def capture_graph(fn: Callable[[], object], calls: int):
    """A CUDA graph of `calls` runs of fn, captured after three warm-up runs on a side stream
    (lazy set-up: Triton compiles, NCCL communicators)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graph_seconds_per_call(fn: Callable[[], object], calls_in_fn: int = 1,
                           graph_calls: int = 20, repeats: int = 10) -> float:
    """Median GPU seconds of one of the `calls_in_fn` calls `fn` makes, timed as a CUDA graph of
    `graph_calls` runs of fn: no host launch time in it, as in a captured decode step."""
    graph = capture_graph(fn, graph_calls)
    seconds = cuda_median_seconds(graph.replay, repeats) / (graph_calls * calls_in_fn)
    del graph
    return seconds


def median(values: Iterable[float]) -> float:
    xs = sorted(values)
    if not xs:
        raise ValueError("median of nothing")
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def device_name(device: str | None) -> str:
    """The accelerator's name when the benchmark runs on CUDA, else the CPU's model name: a
    result file must say what hardware its numbers came from."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str | None) -> dict[str, Any]:
    import torch

    from radixlm.version import __version__

    return {
        "device_name": device_name(device),
        "cuda_available": torch.cuda.is_available(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "radixlm_version": __version__,
        "cpu_count": os.cpu_count(),
        # The process's own command line ("radixlm bench ..." or "python -m ..."); under pytest
        # this is pytest's, hence benchmarks also record the argv given to their main().
        "command": shlex.join(sys.argv),
    }


def default_output_path(name: str, directory: str = "benchmarks") -> str:
    return os.path.join(directory, f"{name}_{time.strftime('%Y%m%d_%H%M%S')}.json")


def require_positive(parser: argparse.ArgumentParser, ns: argparse.Namespace,
                     *names: str) -> None:
    """parser.error naming the first of the flags `names` (attribute names) set below 1."""
    for name in names:
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")


def check_writable(path: str, flag: str) -> None:
    """Exits naming `flag` when results could not be written to `path` (checked before a long
    run, not after it): its directory is made now, and must take a new file."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".radixlm_write_check_"):
            pass
    except OSError as e:
        raise SystemExit(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    if os.path.isdir(path):
        raise SystemExit(f"{flag} {path}: is a directory (give a file name)")


def write_json(path: str, data: dict[str, Any]) -> str:
    """Write results (creating the directory) and return the path."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    return path


def finish_counts(outputs: list[dict]) -> dict[str, int]:
    """How many SGLang-shaped outputs finished by each reason (stop, length, abort)."""
    return dict(Counter((o["meta_info"].get("finish_reason") or {}).get("type", "none")
                        for o in outputs))


def chat_prompt(engine, text: str) -> str:
    """One user message in the model's chat template, or the bare text when the tokenizer has
    no template (a dummy checkpoint's may not)."""
    try:
        return engine.apply_chat_template([{"role": "user", "content": text}])
    except Exception:
        return text + "\n"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def print_summary(line: str) -> None:
    """The summary goes last on stdout, flushed, so a driver can take the final line."""
    print(line, flush=True)


def sync_device(device) -> None:
    """Wait for the device's queued work (timings on CUDA are taken after this)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
