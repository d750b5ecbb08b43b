"""A scripted frontend-language backend for tests without a model."""

from __future__ import annotations

import threading
import time

from radixlm.lang.backends.base import Backend, GenResult, StreamChunk


class ScriptedBackend(Backend):
    """Answers every gen with `reply` (after `delay` s), records calls and their times."""

    def __init__(self, reply: str = "ok", delay: float = 0.0, renderer=None):
        super().__init__()
        self.reply, self.delay, self.renderer = reply, delay, renderer
        self.prompts: list[str] = []
        self.intervals: list[tuple[float, float]] = []
        self.cached: list[str] = []
        self._lock = threading.Lock()

    def generate(self, ctx, args):
        start = time.monotonic()
        time.sleep(self.delay)
        with self._lock:
            self.prompts.append(ctx.text)
            self.intervals.append((start, time.monotonic()))
        reply = self.reply(ctx, args) if callable(self.reply) else self.reply
        return GenResult(reply, {"max_new_tokens": args.max_new_tokens})

    def generate_stream(self, ctx, args):
        for ch in self.generate(ctx, args).text:
            yield StreamChunk(ch)
        yield StreamChunk("", {"done": True})

    def cache_prefix(self, text):
        self.cached.append(text)

    def chat_renderer(self):
        return self.renderer or super().chat_renderer()
