"""radixlm: a fast serving engine for large language models.

Public API: `Engine` (in-process engine), `ServerArgs` (every setting and its default), and
the frontend language (`function`, `gen`, `select`, roles, `RuntimeEndpoint`, ...: see
radixlm/lang/__init__.py), so that `import radixlm as rl` reads like SGLang's frontend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.version import __version__

# The frontend language's names (radixlm.lang), importable lazily from the top level.
_LANG_NAMES = (
    "function", "gen", "gen_int", "gen_string", "select", "separate_reasoning", "image",
    "video", "Runtime", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "get_default_backend", "flush_cache", "get_server_info",
    "global_config",
    "token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized",
    "Program", "ProgramState",
    "ProgramStateGroup", "RuntimeEndpoint", "OpenAI", "EngineBackend", "LangError",
    "VariableNotFoundError", "BackendError", "BackendUnavailableError", "RequestRejectedError",
    "UnsupportedByBackendError",
)
__all__ = ["Engine", "ServerArgs", "__version__", *_LANG_NAMES]

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
    if name in _LANG_NAMES:
        import radixlm.lang
        return getattr(radixlm.lang, name)
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
