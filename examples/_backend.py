"""Shared by the examples: a backend from `--url` (a running `radixlm serve`), or else an
in-process Engine on the bundled model (or `--model-path`)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator

import radixlm as rl


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", default=None,
                   help="a radixlm server, e.g. http://127.0.0.1:30000 (default: start an "
                        "in-process Engine)")
    p.add_argument("--model-path", default=None, help="model for the in-process Engine "
                   "(default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="device for the in-process Engine")
    return p


@contextlib.contextmanager
def backend_from(args: argparse.Namespace) -> Iterator[rl.lang.Backend]:
    """Yields the backend (also set as the default) and stops an Engine it started."""
    if args.url:
        backend = rl.RuntimeEndpoint(args.url)
    else:
        backend = rl.EngineBackend(model_path=args.model_path, device=args.device,
                                   log_level="warning")
    rl.set_default_backend(backend)
    try:
        yield backend
    finally:
        backend.shutdown()
