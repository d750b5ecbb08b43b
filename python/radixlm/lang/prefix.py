"""Finding the prompt prefix that all programs of a batch share, before running them.

Each program is traced up to its first model call against a stand-in backend that records the
prompt and stops the program (and forks / select, which would call the model, stop it too). The
longest common prefix of those prompts is what `run_batch` commits to the cache once, so that
the batch's first wave of requests reuses it instead of each computing it.

Tracing runs the program's Python code up to that point a second time: fine for prompt
building, worth knowing for programs with side effects there (`run_batch(warmup=False)`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

from radixlm.lang.backends.base import (Backend, GenResult, PromptContext, SelectResult,
                                        StreamChunk)
from radixlm.lang.chat import ChatRenderer
from radixlm.lang.choices import ChoicesMethod
from radixlm.lang.ir import SamplingArgs


class _Reached(BaseException):
    """The traced program reached the model. A BaseException, so that a program's own
    `except Exception` cannot swallow it and carry on."""

    def __init__(self, text: str):
        super().__init__("prefix tracing stop")
        self.text = text


class _TracingBackend(Backend):
    def __init__(self, real: Backend):
        super().__init__()
        self.real = real

    def generate(self, ctx: PromptContext, args: SamplingArgs) -> GenResult:
        raise _Reached(ctx.text)

    def generate_stream(self, ctx: PromptContext, args: SamplingArgs) -> Iterator[StreamChunk]:
        raise _Reached(ctx.text)

    def select(self, ctx: PromptContext, choices: list[str], method: ChoicesMethod,
               temperature: float) -> SelectResult:
        raise _Reached(ctx.text)

    def cache_prefix(self, text: str) -> None:
        raise _Reached(text)

    def chat_renderer(self) -> ChatRenderer:
        return self.real.chat_renderer()   # roles must render exactly as in the real run


def prompt_before_first_call(run_traced: Callable[[Backend], Any], real: Backend) -> str:
    """The prompt a program sends with its first model call (its whole text if it makes none).
    `run_traced(backend)` runs the program on `backend` and returns its StreamExecutor."""
    tracer = _TracingBackend(real)
    ex = run_traced(tracer)
    ex.sync(raise_error=False)
    return ex.error.text if isinstance(ex.error, _Reached) else ex.text


def common_prefix(texts: list[str]) -> str:
    return os.path.commonprefix(texts) if texts else ""
