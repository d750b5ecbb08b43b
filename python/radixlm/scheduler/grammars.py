"""The scheduler's grammars: the backend, started on the first constrained request, and the
hand-over of compiled grammars to waiting requests.

A constrained request's grammar compiles in the backend's threads while the request waits; the
request is admitted only once it has its matcher (or is refused: an invalid schema or regex is a
400). xgrammar is imported only when a request first asks for a constraint, so a server that never
sees one never pays for it.
"""

from __future__ import annotations

import logging
from typing import Callable

from radixlm.constrained.base import (ConstraintKey, GrammarBackend, InvalidConstraintError,
                                      create_grammar_backend)
from radixlm.managers.messages import FinishReason
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.grammar_sampling import may_sample_unmasked
from radixlm.scheduler.request import Req

logger = logging.getLogger(__name__)


class RequestGrammars:
    def __init__(self, config: SchedulerConfig, tokenizer, vocab_size: int,
                 eos_token_ids: list[int], device_states: bool = False) -> None:
        """`device_states`: the scheduler keeps the states of token-automaton grammars on the
        device (scheduler/grammar_states.py)."""
        self.config = config
        self.device_states = device_states
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        # The backend once started (None before the first constrained request, or when off);
        # the sampling code reads this, never starting one.
        self.started: GrammarBackend | None = None
        self.error: str | None = None   # why the backend could not start (logged once)

    def backend(self) -> GrammarBackend | None:
        """The backend, started on first use; None when off or when it failed to start."""
        if self.started is None and self.config.grammar_backend != "none" and self.error is None:
            try:
                self.started = create_grammar_backend(self.config.grammar_backend,
                                                      self.tokenizer, self.vocab_size,
                                                      self.eos_token_ids)
            except Exception as e:   # (its imports, or transformers' tokenizer, failed)
                if self.config.tp_size > 1:
                    raise   # (every rank must decide alike: they stop, as they did before)
                logger.exception("the grammar backend could not start")
                self.error = f"constrained decoding is unavailable: {e}"
        return self.started

    def start_compiling(self, req: Req) -> FinishReason | None:
        """Start compiling `req`'s grammar, if it has a constraint. Returns why the request is
        refused instead: constrained decoding off (400) or unavailable (503)."""
        key = ConstraintKey.of(req.sampling_params)
        if key is None:
            return None
        backend = self.backend()
        if backend is None:
            return FinishReason("abort", message=self.error or (
                "constrained decoding is off (--grammar-backend none)"),
                status_code=503 if self.error else 400)
        req.grammar_future = backend.compile(key)
        return None

    def resolve(self, waiting: list[Req], finish: Callable[[Req, FinishReason], None]) -> None:
        """Give compiled grammars to their waiting requests; refuse (and remove from `waiting`)
        those whose grammar failed to compile."""
        for req in [r for r in waiting if r.grammar_future is not None]:
            if not req.grammar_future.done() and self.config.tp_size == 1:
                continue   # (tensor-parallel ranks wait: when it is done must not differ)
            fut, req.grammar_future = req.grammar_future, None
            try:
                req.grammar = self.started.matcher(fut.result())
                req.grammar_optimistic = (not self.config.disable_optimistic_grammar
                                          and may_sample_unmasked(req.sampling_params))
                req.grammar_on_device = (self.device_states
                                         and req.grammar.device_base is not None)
            except InvalidConstraintError as e:
                waiting.remove(req)
                finish(req, FinishReason("abort", message=str(e), status_code=400))
