"""The grammar-backend interface: compile a constraint (cached, off the scheduler thread) into a
matcher that masks the vocabulary, follows sampled tokens, and finds forced continuations.

Backends are chosen by --grammar-backend and imported lazily (a server that never sees a
constraint never imports xgrammar).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.sampling.params import CONSTRAINT_KINDS, SamplingParams
from radixlm.sampling.token_mask import TokenMask
from radixlm.utils.device import to_device

if TYPE_CHECKING:
    from radixlm.constrained.token_automaton import AutomataTable


@dataclass(frozen=True)
class ConstraintKey:
    kind: str    # one of CONSTRAINT_KINDS
    spec: str

    @classmethod
    def of(cls, params: SamplingParams) -> "ConstraintKey | None":
        for kind in CONSTRAINT_KINDS:
            spec = getattr(params, kind)
            if spec is not None:
                return cls(kind, spec)
        return None


class InvalidConstraintError(ValueError):
    """The constraint does not compile; the message is the compiler's."""


class GrammarMatcher(ABC):
    """Per-request grammar state."""

    # Its grammar's row in the backend's static masks (`GrammarBackend.static_masks`): the
    # tokens no state of the grammar accepts. 0: none known.
    static_mask_row: int = 0
    # Set (by constrained/token_automaton.py's matcher) when the grammar's automaton is in the
    # backend's device tables: the scheduler keeps the request's state on the device.
    device_base: int | None = None

    @abstractmethod
    def accept_token(self, token: int) -> bool: ...

    @abstractmethod
    def rollback(self, num_tokens: int) -> None: ...

    @abstractmethod
    def is_terminated(self) -> bool: ...

    @abstractmethod
    def find_jump_forward_string(self) -> str: ...

    @abstractmethod
    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        """Write this matcher's allowed tokens into row `row` of a mask from allocate_mask."""


class GrammarBackend(ABC):
    @abstractmethod
    def compile(self, key: ConstraintKey) -> "Future[object]":
        """Start (or reuse) compiling; the future's result is what `matcher` takes, or it raises
        InvalidConstraintError."""

    @abstractmethod
    def matcher(self, compiled: object) -> GrammarMatcher: ...

    @abstractmethod
    def allocate_mask(self, batch_size: int) -> torch.Tensor:
        """A CPU mask for a batch, every token allowed."""

    def static_masks(self, rows: list[int], device: torch.device) -> torch.Tensor | None:
        """Device masks, in allocate_mask's layout, of the static mask rows `rows` (matchers'
        `static_mask_row`; 0 allows every token); None when there are none."""
        return None

    def automata_table(self) -> "AutomataTable | None":
        """The device tables of the grammars that run as token automata (matchers with a
        `device_base`); None when the backend has none."""
        return None

    def fill_vocab_masks(self, matchers: list[GrammarMatcher], mask: torch.Tensor,
                         rows: list[int]) -> None:
        """Fill row rows[i] of `mask` from matchers[i] (a backend may do it in one batched,
        multi-threaded call)."""
        for matcher, row in zip(matchers, rows):
            matcher.fill_vocab_mask(mask, row)

    @abstractmethod
    def apply_mask(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place (mask already on the device)."""

    def on_device(self, mask: torch.Tensor, device: torch.device) -> TokenMask:
        """A filled host mask as the sampler's `vocab_mask`. Staged through pinned memory: a
        copy from pageable memory would wait for the forward pass running on the GPU, and the
        host would stop queueing work until it ends."""
        return TokenMask(to_device(mask, torch.int32, device), apply_words=self.apply_mask)

    def shutdown(self) -> None:
        pass


_BACKENDS = {"xgrammar": "radixlm.constrained.xgrammar_backend:XGrammarBackend"}


def create_grammar_backend(name: str, tokenizer, vocab_size: int,
                           eos_token_ids: list[int]) -> GrammarBackend | None:
    """None for --grammar-backend none (constrained requests are then rejected)."""
    if name == "none":
        return None
    if name not in _BACKENDS:
        raise ValueError(f"--grammar-backend: unknown backend {name!r}; choose from "
                         f"{sorted(_BACKENDS) + ['none']}")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(tokenizer, vocab_size, eos_token_ids)
