"""Environment knobs, typed, in one place. Read when used, so tests can set them per engine."""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def check_invariants() -> bool:
    """RADIXLM_CHECK_INVARIANTS=1: the scheduler checks KV accounting after every step (tests)."""
    return _flag("RADIXLM_CHECK_INVARIANTS")


def cache_dir() -> str:
    """RADIXLM_CACHE_DIR: where converted GGUF models are kept (default ~/.cache/radixlm)."""
    return os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm")
