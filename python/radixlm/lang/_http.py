"""The HTTP client library: `httpx`, or its successor `httpx2` (same API) where only that one is
installed (recent `openai` releases depend on httpx2 instead of httpx)."""

from __future__ import annotations

try:
    import httpx  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import httpx2 as httpx  # type: ignore[no-redef]  # noqa: F401
    except ImportError as e:
        raise ImportError("radixlm.lang's HTTP backends need `httpx` (pip install httpx)") from e

__all__ = ["httpx"]
