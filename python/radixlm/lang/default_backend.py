"""The backend programs run on when `run(backend=...)` is not given, and turning what a user
passes as a backend (a Backend, or a radixlm Engine) into a Backend."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from radixlm.lang.backends.base import Backend

_lock = threading.Lock()
_default: Backend | None = None
# One EngineBackend per Engine, so usage counters and the renderer are shared between runs.
_engine_backends: "weakref.WeakKeyDictionary[Any, Backend]" = weakref.WeakKeyDictionary()


def as_backend(obj: Any) -> Backend:
    if isinstance(obj, Backend):
        return obj
    # Duck-typed: importing Engine just to check would pull torch into OpenAI-only programs.
    if hasattr(obj, "tokenizer_manager") and hasattr(obj, "generate"):
        with _lock:
            if obj not in _engine_backends:
                from radixlm.lang.backends.engine import EngineBackend
                _engine_backends[obj] = EngineBackend(obj)
            return _engine_backends[obj]
    raise TypeError(f"not a backend: {obj!r}; use RuntimeEndpoint(url), OpenAI(model, ...), "
                    f"an Engine or EngineBackend(engine)")


def set_default_backend(backend: Any) -> None:
    global _default
    resolved = as_backend(backend)
    with _lock:
        _default = resolved


def get_default_backend() -> Backend | None:
    with _lock:
        return _default


def resolve_backend(backend: Any | None) -> Backend:
    if backend is not None:
        return as_backend(backend)
    default = get_default_backend()
    if default is None:
        raise ValueError("no backend: pass run(..., backend=...) or call "
                         "set_default_backend(RuntimeEndpoint(url)) first")
    return default
