"""radixlm: a fast serving engine for large language models.

Public API: `Engine` (in-process engine), `ServerArgs` (every setting and its default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Engine", "ServerArgs", "__version__"]

if TYPE_CHECKING:
    from radixlm.config import ServerArgs
    from radixlm.entrypoints.engine import Engine


def __getattr__(name: str):
    # Lazy: `import radixlm` stays cheap (no torch import) until something is used.
    if name == "Engine":
        from radixlm.entrypoints.engine import Engine
        return Engine
    if name == "ServerArgs":
        from radixlm.config import ServerArgs
        return ServerArgs
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
