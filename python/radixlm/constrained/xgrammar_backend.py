"""Grammar backend on xgrammar: JSON schema, regex and EBNF compiled to token-level matchers."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import xgrammar as xgr

import radixlm.envs as envs
from radixlm.constrained.base import (ConstraintKey, GrammarBackend, GrammarMatcher,
                                      InvalidConstraintError)


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, compiled: xgr.CompiledGrammar):
        self._m = xgr.GrammarMatcher(compiled)

    def accept_token(self, token: int) -> bool:
        return self._m.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()

    def find_jump_forward_string(self) -> str:
        return self._m.find_jump_forward_string()

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(mask, row)


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(eos_token_ids))
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        # Compilation runs on a pool so that one slow schema never stalls the scheduler loop.
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")
        self._cache: dict[ConstraintKey, Future] = {}
        self._lock = threading.Lock()
        # One C++ call fills every constrained row of a step (no Python loop per row), on one
        # thread unless RADIXLM_GRAMMAR_FILL_THREADS says otherwise: xgrammar's worker threads
        # made filling slower on the GPU host (envs.grammar_fill_threads).
        self.fill_threads = envs.grammar_fill_threads()
        self._batch_filler = xgr.BatchGrammarMatcher(self.fill_threads)

    def compile(self, key: ConstraintKey) -> Future:
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._cache[key] = self.pool.submit(self._compile, key)
            return fut

    def _compile(self, key: ConstraintKey) -> xgr.CompiledGrammar:
        try:
            if key.kind == "json_schema":
                try:
                    json.loads(key.spec)
                except json.JSONDecodeError as e:
                    raise InvalidConstraintError(f"json_schema is not valid JSON: {e}") from None
                # Compact JSON (no free whitespace between tokens): small models otherwise
                # wander into runs of spaces, and fixed separators are what make keys and
                # punctuation forced, i.e. what jump-forward can skip.
                return self.compiler.compile_json_schema(key.spec, any_whitespace=False)
            if key.kind == "regex":
                return self.compiler.compile_regex(key.spec)
            return self.compiler.compile_grammar(key.spec)
        except InvalidConstraintError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with the reason
            raise InvalidConstraintError(f"invalid {key.kind}: {e}") from None

    def matcher(self, compiled: object) -> GrammarMatcher:
        return XGrammarMatcher(compiled)  # type: ignore[arg-type]

    def allocate_mask(self, batch_size: int, pinned: bool = False) -> torch.Tensor:
        if not pinned:
            return xgr.allocate_token_bitmask(batch_size, self.vocab_size)
        # From the caching host allocator: a block is reused only after its copy has run.
        return torch.full((batch_size, xgr.get_bitmask_shape(1, self.vocab_size)[1]), -1,
                          dtype=torch.int32, pin_memory=True)

    def fill_vocab_masks(self, matchers: list[GrammarMatcher], mask: torch.Tensor,
                         rows: list[int]) -> None:
        self._batch_filler.batch_fill_next_token_bitmask(
            [m._m for m in matchers], mask, rows)  # type: ignore[attr-defined]

    def apply_mask(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
