"""Grammar backend on xgrammar: JSON schema, regex and EBNF compiled to token-level matchers."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

import radixlm.envs as envs
from radixlm.model_executor.light_tokenizer import full_tokenizer
from radixlm.constrained.alphabet import StaticMaskTable, TokenAsciiIndex, ascii_alphabet
from radixlm.constrained.byte_automaton import NotRegular, byte_dfa
from radixlm.constrained.regex_caret import protect_leading_caret
from radixlm.constrained.automaton_matcher import AutomatonMatcher
from radixlm.constrained.token_automaton import (AutomataTable, TokenAutomaton, VocabBytes,
                                                 token_automaton)
from radixlm.constrained.base import (ConstraintKey, GrammarBackend, GrammarMatcher,
                                      InvalidConstraintError)
from radixlm.utils.json_schema_check import unenforced_keyword
from radixlm.utils.grammar_errors import compiler_reason


logger = logging.getLogger(__name__)

AUTO_FILL_THREADS = 8


@dataclass
class FillTimer:
    """Chooses between a serial and a threaded mask fill by their measured cost per row.

    The cost of a fill depends on the grammars and states being served (~10 us a row for a
    simple regex, ~400 us for bounded JSON strings) and threads pay off only for costly ones, so
    both ways are timed: an exponential average of each, the faster one used, and the other
    tried again every EXPLORE_EVERY fills (the mix of requests changes). With explore off (a
    fixed thread count) the threaded filler is always used."""

    explore: bool = True
    min_threaded_fill_s: float = 1e-3
    serial_s: float | None = None
    threaded_s: float | None = None
    calls: int = 0
    exploring: bool = False       # this fill tries the slower way: its time replaces the old

    EXPLORE_EVERY = 16
    DECAY = 0.8

    def pick_threaded(self, rows: int) -> bool:
        self.calls += 1
        if not self.explore:
            return True
        if self.serial_s is not None and self.serial_s * rows < self.min_threaded_fill_s:
            # Waking the worker threads costs more than a fill this cheap (a simple regex: ~10
            # us a row, serially; threaded fills of such batches were measured at 6-7 ms on
            # the H200 host), so it is not even explored.
            self.exploring = False
            return False
        if self.serial_s is None or self.threaded_s is None:
            return self.serial_s is not None       # serial first, then threaded once
        faster_threaded = self.threaded_s < self.serial_s
        self.exploring = self.calls % self.EXPLORE_EVERY == 0
        return faster_threaded != self.exploring

    def record(self, threaded: bool, seconds_per_row: float) -> None:
        old = self.threaded_s if threaded else self.serial_s
        if old is None or self.exploring:
            new = seconds_per_row
        else:
            new = self.DECAY * old + (1 - self.DECAY) * seconds_per_row
        if threaded:
            self.threaded_s = new
        else:
            self.serial_s = new


@dataclass(frozen=True)
class Compiled:
    """A compile's result: xgrammar's grammar and its row in the static masks; for a regular
    grammar also its token automaton, and where that sits in the device tables (None: host
    only)."""
    grammar: xgr.CompiledGrammar
    static_mask_row: int
    automaton: TokenAutomaton | None = None
    device_base: int | None = None


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, compiled: xgr.CompiledGrammar, never: frozenset[int] = frozenset(),
                 static_mask_row: int = 0):
        self._m = xgr.GrammarMatcher(compiled)
        self.static_mask_row = static_mask_row
        self._never = never
        # An xgrammar matcher (terminate_without_stop_token off, its default) terminates only
        # by accepting one of its stop tokens: after any other token the answer is known
        # without asking it (a call a token saved, on the scheduler's critical path). Every
        # change of the matcher's state must go through this class's methods and keep
        # `_may_be_terminated` right (rollback sets it: "ask").
        self._stops = frozenset(self._m.stop_token_ids)
        self._may_be_terminated = False

    def accept_token(self, token: int) -> bool:
        if token in self._never:
            return False   # (xgrammar would print a warning for each; unmasked rows draw them)
        if not self._m.accept_token(token):
            return False
        self._may_be_terminated = token in self._stops
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._m.rollback(num_tokens)
            self._may_be_terminated = True    # (unknown: ask the matcher)

    def is_terminated(self) -> bool:
        return self._may_be_terminated and self._m.is_terminated()

    def find_jump_forward_string(self) -> str:
        return self._m.find_jump_forward_string()

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(mask, row)


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        # xgrammar reads the vocabulary through transformers' tokenizer; a scheduler that
        # started with the light one (model_executor/light_tokenizer.py) loads it now, once.
        info = xgr.TokenizerInfo.from_huggingface(full_tokenizer(tokenizer),
                                                  vocab_size=vocab_size,
                                                  stop_token_ids=list(eos_token_ids))
        self.vocab_size = vocab_size
        # Ids no grammar accepts (the vocabulary's padding; xgrammar's "special" ids).
        self._never = frozenset(info.special_token_ids) - set(info.stop_token_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        # Compilation runs on a pool so that one slow schema never stalls the scheduler loop.
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")
        self._cache: dict[ConstraintKey, Future] = {}
        self._lock = threading.Lock()
        # One C++ call fills every constrained row of a step (no Python loop per row), serially
        # or on xgrammar's worker threads: whichever is faster for the grammars being served
        # (FillTimer), unless RADIXLM_GRAMMAR_FILL_THREADS fixes the thread count.
        fixed = envs.grammar_fill_threads()
        self.fill_threads = fixed or min(AUTO_FILL_THREADS, max((os.cpu_count() or 1) // 2, 1))
        self._serial = xgr.BatchGrammarMatcher(1)
        self._threaded = (xgr.BatchGrammarMatcher(self.fill_threads)
                          if self.fill_threads > 1 else None)
        self._timer = FillTimer(explore=fixed is None and self._threaded is not None)
        # Tokens each grammar can never accept, masked on the device (constrained/alphabet.py).
        self._static = StaticMaskTable(TokenAsciiIndex(info.decoded_vocab, vocab_size),
                                       never=sorted(self._never),
                                       always=list(info.stop_token_ids))
        # Regular grammars run as token automata (constrained/token_automaton.py), their
        # state kept on the device; RADIXLM_DISABLE_GRAMMAR_AUTOMATA=1 leaves all to xgrammar.
        self._stop_ids = list(info.stop_token_ids)
        self._vocab_bytes: VocabBytes | None = None
        self._decoded_vocab = info.decoded_vocab
        self.automata = None if envs.disable_grammar_automata() else AutomataTable(vocab_size)

    def compile(self, key: ConstraintKey) -> Future:
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._cache[key] = self.pool.submit(self._compile, key)
            return fut

    def _compile(self, key: ConstraintKey) -> Compiled:
        grammar = self._compile_grammar(key)
        try:
            row = self._static.row_for(ascii_alphabet(grammar.grammar.serialize_json()))
        except Exception:   # (an optimisation: the grammar works without it)
            logger.exception("no static mask for a %s constraint", key.kind)
            row = 0
        automaton = self._automaton(key) if self.automata is not None else None
        base = self.automata.add(automaton) if automaton is not None else None
        return Compiled(grammar, row, automaton, base)

    def _automaton(self, key: ConstraintKey) -> TokenAutomaton | None:
        """A regex's or EBNF grammar's token automaton, if it is a small regular one. Read from
        the grammar as parsed, before compiling: the compiler adds lookaheads it infers, which
        the automaton does not need (a lookahead the user wrote makes it not regular here)."""
        try:
            if key.kind == "regex":
                parsed = xgr.Grammar.from_regex(protect_leading_caret(key.spec))
            elif key.kind == "ebnf":
                parsed = xgr.Grammar.from_ebnf(key.spec)
            else:
                return None
            dfa = byte_dfa(parsed.serialize_json())
        except NotRegular:
            return None
        except Exception:   # (an optimisation: xgrammar's matcher serves the grammar without it)
            logger.exception("no token automaton for a %s constraint", key.kind)
            return None
        if dfa.num_states > self.automata.capacity:
            return None    # (it could never be on the device; its host tables alone are large)
        with self._lock:
            if self._vocab_bytes is None:
                self._vocab_bytes = VocabBytes(self._decoded_vocab, self.vocab_size)
        return token_automaton(dfa, self._vocab_bytes, self._stop_ids, sorted(self._never))

    def _compile_grammar(self, key: ConstraintKey) -> xgr.CompiledGrammar:
        try:
            if key.kind == "json_schema":
                try:
                    schema = json.loads(key.spec)
                except json.JSONDecodeError as e:
                    raise InvalidConstraintError(f"json_schema is not valid JSON: {e}") from None
                _check_enforced(schema, "json_schema")
                # Compact JSON (no free whitespace between tokens): small models otherwise
                # wander into runs of spaces, and fixed separators are what make keys and
                # punctuation forced, i.e. what jump-forward can skip.
                return self.compiler.compile_json_schema(key.spec, any_whitespace=False)
            if key.kind == "regex":
                return self.compiler.compile_regex(protect_leading_caret(key.spec))
            if key.kind == "structural_tag":
                return self._compile_structural_tag(key.spec)
            return self.compiler.compile_grammar(key.spec)
        except InvalidConstraintError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with the reason
            raise InvalidConstraintError(f"invalid {key.kind}: {compiler_reason(e)}") from None

    def _compile_structural_tag(self, spec: str) -> xgr.CompiledGrammar:
        """SGLang's form (structures + triggers) through xgrammar's tag items; xgrammar's own
        (`format`) as it is."""
        try:
            tag = json.loads(spec)
        except json.JSONDecodeError as e:
            raise InvalidConstraintError(f"structural_tag is not valid JSON: {e}") from None
        if not isinstance(tag, dict) or "structures" not in tag and "format" not in tag:
            raise InvalidConstraintError(
                "invalid structural_tag: it needs `structures` and `triggers` (or xgrammar's "
                "`format`)")
        if "format" in tag:
            return self.compiler.compile_structural_tag(spec)
        structures, triggers = tag.get("structures"), tag.get("triggers")
        if not isinstance(structures, list) or not structures or not isinstance(triggers, list) \
                or not all(isinstance(t, str) and t for t in triggers):
            raise InvalidConstraintError("invalid structural_tag: `structures` must be a "
                                         "non-empty list and `triggers` a list of strings")
        items = []
        for s in structures:
            if not isinstance(s, dict) or not all(isinstance(s.get(k), str)
                                                  for k in ("begin", "end")):
                raise InvalidConstraintError("invalid structural_tag: each structure needs "
                                             "`begin`, `schema` and `end`")
            schema = s.get("schema")
            _check_enforced(json.loads(schema) if isinstance(schema, str) else schema,
                            "structural_tag")
            items.append(xgr.StructuralTagItem(
                begin=s["begin"], end=s["end"],
                schema=schema if isinstance(schema, str) else json.dumps(schema)))
        return self.compiler.compile_structural_tag(items, triggers)

    def matcher(self, compiled: object) -> GrammarMatcher:
        assert isinstance(compiled, Compiled)
        if compiled.automaton is not None:
            return AutomatonMatcher(compiled.automaton, compiled.device_base,
                                    compiled.static_mask_row)
        return XGrammarMatcher(compiled.grammar, self._never, compiled.static_mask_row)

    def automata_table(self) -> AutomataTable | None:
        return self.automata

    def static_masks(self, rows: list[int], device: torch.device) -> torch.Tensor | None:
        return self._static.gather(rows, device)

    def allocate_mask(self, batch_size: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(batch_size, self.vocab_size)

    def fill_vocab_masks(self, matchers: list[GrammarMatcher], mask: torch.Tensor,
                         rows: list[int]) -> None:
        if any(isinstance(m, AutomatonMatcher) for m in matchers):
            # (an automaton's mask is a table row, copied here; xgrammar fills the others)
            others: list[tuple[GrammarMatcher, int]] = []
            for m, r in zip(matchers, rows):
                if isinstance(m, AutomatonMatcher):
                    m.fill_vocab_mask(mask, r)
                else:
                    others.append((m, r))
            if not others:
                return
            matchers, rows = [m for m, _ in others], [r for _, r in others]
        threaded = (self._threaded is not None and len(rows) > 1
                    and self._timer.pick_threaded(len(rows)))
        filler = self._threaded if threaded else self._serial
        start = time.perf_counter()
        filler.batch_fill_next_token_bitmask(
            [m._m for m in matchers], mask, rows)  # type: ignore[attr-defined]
        self._timer.record(threaded, (time.perf_counter() - start) / len(rows))

    def apply_mask(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _check_enforced(schema: Any, kind: str) -> None:
    problem = unenforced_keyword(schema)
    if problem:
        raise InvalidConstraintError(f"invalid {kind}: it uses {problem}, which the grammar "
                                     f"cannot enforce (the output could break the schema)")
