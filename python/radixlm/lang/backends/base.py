"""What a program needs from whatever runs the model.

A backend turns the state's prompt into generated text, scores `select` choices, commits shared
prefixes to the server's cache, and knows how the model renders chat roles. Backends are
thread-safe: a program's forks and `run_batch`'s programs call one backend from many threads.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

from radixlm.lang.chat import ChatRenderer, PlainRenderer
from radixlm.lang.choices import ChoicesMethod
from radixlm.lang.errors import UnsupportedByBackendError
from radixlm.lang.ir import SamplingArgs


@dataclass
class PromptContext:
    """The state as a backend sees it at one gen / select."""
    text: str                                   # the whole prompt so far
    messages: list[dict[str, str]]              # finished chat messages
    role: str | None = None                     # the role being written, if any
    role_content: str = ""                      # what that role holds so far


@dataclass
class GenResult:
    text: str
    meta_info: dict[str, Any] = field(default_factory=dict)
    # With n > 1: every sample's text and meta_info, the first being `text` / `meta_info`
    samples: list[str] = field(default_factory=list)
    sample_meta: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of_samples(cls, texts: list[str], metas: list[dict[str, Any]]) -> "GenResult":
        return cls(texts[0], metas[0], texts, metas) if len(texts) > 1 else \
            cls(texts[0], metas[0])


@dataclass
class StreamChunk:
    delta: str                                  # new text since the previous chunk
    meta_info: dict[str, Any] | None = None     # current meta_info (final in the last chunk)


@dataclass
class SelectResult:
    index: int
    choice: str
    scores: list[float]                         # length-normalized logprob of each choice
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Usage:
    """Token counts over every request a backend sent (for the cache hit rate of a workload)."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, meta: dict[str, Any]) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += int(meta.get("prompt_tokens") or 0)
            self.cached_tokens += int(meta.get("cached_tokens") or 0)
            self.completion_tokens += int(meta.get("completion_tokens") or 0)

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                    "cached_tokens": self.cached_tokens,
                    "completion_tokens": self.completion_tokens,
                    "cache_hit_rate": self.cache_hit_rate}

    def reset(self) -> None:
        with self._lock:
            self.requests = self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0


class Backend(ABC):
    """Base class; subclasses implement `generate` and whatever else they support."""

    def __init__(self) -> None:
        self.usage = Usage()

    @abstractmethod
    def generate(self, ctx: PromptContext, args: SamplingArgs) -> GenResult:
        """Generate a continuation of the prompt with the given (fully merged) settings."""

    def generate_stream(self, ctx: PromptContext, args: SamplingArgs) -> Iterator[StreamChunk]:
        """Incremental generation; backends that cannot stream yield one chunk."""
        res = self.generate(ctx, args)
        yield StreamChunk(res.text, res.meta_info)

    def select(self, ctx: PromptContext, choices: list[str], method: ChoicesMethod,
               temperature: float) -> SelectResult:
        raise UnsupportedByBackendError(
            f"{type(self).__name__} cannot run select(): it needs prompt logprobs, which this "
            f"backend does not provide; use gen() with a regex instead, or a radixlm backend")

    def api_speculation(self, ctx: PromptContext) -> str | None:
        """How `@function(num_api_spec_tokens=N)` may merge this state's gens into fewer calls
        (speculative.py): "completion" (one call runs on past a gen's stop), "chat" (one call
        writes a whole assistant message, parsed into its gens), or None (no speculation).
        Only worth it where each call is billed and recomputes the prompt; a radix-cached
        backend answers the separate calls cheaply and exactly."""
        return None

    def cache_prefix(self, text: str) -> None:
        """Commit `text` to the server's prefix cache (before forks / a batch share it).
        Backends without a controllable cache do nothing."""

    def chat_renderer(self) -> ChatRenderer:
        return PlainRenderer()

    def flush_cache(self, empty_cache: bool = True) -> None:
        """Drop the server's prefix cache (no-op where there is none). empty_cache: SGLang's
        flag for a server that also frees its allocator's cached memory."""

    def get_server_info(self) -> dict[str, Any]:
        return {}

    def get_model_name(self) -> str:
        """The served model (SGLang's backend.get_model_name(): the model path)."""
        return ""

    def shutdown(self) -> None:
        """Release what the backend owns (an in-process engine, connections)."""
