"""The frontend language: programs that call a model, in SGLang's frontend shape.

    import radixlm as rl

    @rl.function
    def qa(s, question):
        s += rl.user(question)
        s += rl.assistant(rl.gen("answer", max_tokens=64))

    rl.set_default_backend(rl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(qa.run(question="Why is the sky blue?")["answer"])

Everything here is also reachable as `radixlm.<name>` (lazily, see radixlm/__init__.py).
Backends are imported on first use, so an OpenAI-only program never imports torch.
"""

from __future__ import annotations

from typing import Any

from radixlm.lang.api import (assistant, assistant_begin, assistant_end, flush_cache, function,
                              gen, gen_int, gen_string, get_server_info, image, select,
                              separate_reasoning, system, system_begin, system_end, user,
                              user_begin, user_end, video)
from radixlm.lang.backends.base import Backend
from radixlm.lang.choices import (greedy_token_selection, token_length_normalized,
                                  unconditional_likelihood_normalized)
from radixlm.lang.default_backend import get_default_backend, set_default_backend
from radixlm.lang.global_config import global_config
from radixlm.lang.errors import (BackendError, BackendUnavailableError, LangError,
                                 RequestRejectedError, UnsupportedByBackendError,
                                 VariableNotFoundError)
from radixlm.lang.program import Program
from radixlm.lang.state import ProgramState, ProgramStateGroup

_LAZY_BACKENDS = {
    "RuntimeEndpoint": "radixlm.lang.backends.runtime_endpoint",
    "OpenAI": "radixlm.lang.backends.openai",
    "EngineBackend": "radixlm.lang.backends.engine",
    "Runtime": "radixlm.lang.runtime",
    "Engine": "radixlm.entrypoints.engine",
}

__all__ = [
    "function", "gen", "gen_int", "gen_string", "select", "separate_reasoning", "image",
    "video", "system", "user", "assistant", "global_config",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "get_default_backend", "flush_cache", "get_server_info",
    "token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized",
    "Program", "ProgramState",
    "ProgramStateGroup", "Backend", "LangError", "VariableNotFoundError", "BackendError",
    "BackendUnavailableError", "RequestRejectedError", "UnsupportedByBackendError",
    *_LAZY_BACKENDS,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_BACKENDS:
        import importlib
        return getattr(importlib.import_module(_LAZY_BACKENDS[name]), name)
    raise AttributeError(f"module 'radixlm.lang' has no attribute {name!r}")
