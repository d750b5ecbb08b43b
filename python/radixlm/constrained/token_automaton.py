"""A regular grammar as a token-level automaton: for every state, the state after each token of
the vocabulary (or none), so a matcher's step is one table lookup and its mask one table row.

Why: xgrammar's matcher costs the scheduler ~2 us a row to accept a token and more to fill a
mask, on the critical path of every constrained step. A grammar that is a small byte DFA
(constrained/byte_automaton.py: most regexes) is turned into tables once, at compile time, and
kept on the device too (`AutomataTable`): the scheduler then keeps each constrained request's
state on the device, masks its row from the state's table row and moves the state by the sampled
token, all queued behind the forward pass (scheduler/grammar_states.py). The mask is exact, so the
tokens are masked sampling's, with no redraws, and no host work per row beyond a table lookup
when the token is processed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from radixlm.constrained.alphabet import token_bitmask
from radixlm.constrained.byte_automaton import ByteDFA
from radixlm.utils.device import to_device

# The device tables of all automata together: a row of the vocabulary per state (int32 next
# states, plus the state's bitmask). 64 MiB holds ~330 states of a 49k vocabulary, ~100 of a
# 152k one; grammars past it keep their automaton on the host only.
DEVICE_TABLE_BYTES = 64 << 20
WALK_STATES = 8


class VocabBytes:
    """The vocabulary's decoded bytes as a matrix, tokens sorted longest first (so the tokens
    still being walked at byte j are a prefix of the rows)."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int):
        tokens = list(decoded_vocab)[:vocab_size]
        self.vocab_size = vocab_size
        self.decoded = len(tokens)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        self.order = np.argsort(-lengths, kind="stable")
        width = int(lengths.max()) if len(tokens) else 0
        # (the tokens' bytes joined, each byte placed by its token and offset, as
        # alphabet.TokenAsciiIndex reads them: no Python loop over the vocabulary)
        flat = np.frombuffer(b"".join(tokens), dtype=np.uint8)
        owner = np.repeat(np.arange(len(tokens)), lengths)
        offset = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        by_id = np.zeros((len(tokens), width), dtype=np.uint8)
        by_id[owner, offset] = flat
        self.bytes = by_id[self.order]
        sorted_lengths = lengths[self.order]
        # How many (sorted) tokens are longer than j, for each byte position j.
        self.walking = [int(np.count_nonzero(sorted_lengths > j)) for j in range(width)]
        # The same bytes with 256 past each token's end (what a byte class map reads).
        self.padded = np.where(np.arange(width) < sorted_lengths[:, None],
                               self.bytes.astype(np.uint16), np.uint16(256))
        self.empty = lengths == 0


@dataclass
class TokenAutomaton:
    next_state: np.ndarray   # [states, vocab] int32: -1 not allowed, `terminated` for a stop
    allowed: torch.Tensor    # [states, words] int32 bitmask, xgrammar's layout (CPU)
    accepting: np.ndarray    # [states] bool
    forced: list[str]        # per state: the text every continuation starts with

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])

    @property
    def terminated(self) -> int:
        """The `next_state` value of a stop token where the grammar may end."""
        return self.num_states


def token_automaton(dfa: ByteDFA, vocab: VocabBytes, stop_ids: Sequence[int],
                    never_ids: Sequence[int]) -> TokenAutomaton:
    states = dfa.num_states
    dead = states
    if states <= WALK_STATES:
        # (a few states: walking every token once is cheaper than finding the classes)
        walk = _walk(_step_table(dfa.next_state), vocab.bytes, vocab.walking, states)
    else:
        step, sequences, walking, token_column = _class_sequences(dfa, vocab)
        walk = _walk(step, sequences, walking, states)[:, token_column]
    nxt = np.full((states, vocab.vocab_size), -1, dtype=np.int32)
    nxt[:, vocab.order] = np.where(walk == dead, -1, walk)
    nxt[:, :vocab.decoded][:, vocab.empty] = -1
    nxt[:, list(never_ids)] = -1
    stops = [t for t in stop_ids if 0 <= t < vocab.vocab_size]
    nxt[:, stops] = np.where(dfa.accepting, states, -1)[:, None]
    return TokenAutomaton(nxt, token_bitmask(nxt >= 0), dfa.accepting.copy(),
                          [_forced_text(dfa, s) for s in range(states)])


def _step_table(next_state: np.ndarray) -> np.ndarray:
    """[states + 1, symbols + 1] int32: `next_state` [states, symbols] with -1 (no match) and
    a last row and column (past a token's end) leading to the dead state `states`."""
    states, symbols = next_state.shape
    step = np.full((states + 1, symbols + 1), states, dtype=np.int32)
    step[:states, :symbols] = np.where(next_state < 0, states, next_state)
    return step


def _walk(step: np.ndarray, sequences: np.ndarray, walking: list[int],
          states: int) -> np.ndarray:
    """[states, rows]: the state each row of `sequences` (symbols of `step`'s columns, longest
    first; walking[j]: the rows longer than j) leads every state to (`states`: dead)."""
    walk = np.repeat(np.arange(states, dtype=np.int32)[:, None], sequences.shape[0], axis=1)
    # A few states at a time: each numpy call holds the GIL, and the scheduler's thread waits
    # for it (this runs on a compile thread); small calls let it in between.
    for first in range(0, states, WALK_STATES):
        part = walk[first:first + WALK_STATES]
        for j, n in enumerate(walking):
            part[:, :n] = step[part[:, :n], sequences[:n, j]]
    return walk


def _class_sequences(dfa: ByteDFA, vocab: VocabBytes
                     ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray]:
    """Bytes that every state treats alike form a class, and tokens whose bytes fall in the
    same classes move every state alike, so one token of each class sequence is walked (for
    `[a-z]{0,150}`, 221 instead of 49k): (the step over classes, the distinct sequences
    longest first, how many are longer than each position, each decoded token's sequence)."""
    columns, byte_class = np.unique(dfa.next_state.T, axis=0, return_inverse=True)
    classes = columns.shape[0]            # (the end of a token reads as class `classes`)
    step = _step_table(columns.T)
    symbol = np.append(byte_class.reshape(-1), classes).astype(
        np.uint8 if classes < 255 else np.uint16)
    sequences = symbol[vocab.padded]
    # (each sequence as one opaque value: np.unique over a matrix's rows is ~30x slower)
    keys = np.ascontiguousarray(sequences).view(
        np.dtype((np.void, sequences.dtype.itemsize * sequences.shape[1]))).reshape(-1)
    _, first, token_column = np.unique(keys, return_index=True, return_inverse=True)
    unique = sequences[first]
    lengths = (unique != classes).sum(axis=1)
    order = np.argsort(-lengths, kind="stable")          # longest first
    walking = [int(np.count_nonzero(lengths > j)) for j in range(unique.shape[1])]
    return step, unique[order], walking, np.argsort(order)[token_column.reshape(-1)]


def _forced_text(dfa: ByteDFA, state: int) -> str:
    """The bytes the DFA forces from `state` (one possible byte at a time, until it may end or
    branch), cut to whole UTF-8 characters."""
    out, seen = bytearray(), {state}
    while not dfa.accepting[state]:
        options = np.flatnonzero(dfa.next_state[state] >= 0)
        if len(options) != 1:
            break
        out.append(int(options[0]))
        state = int(dfa.next_state[state, options[0]])
        if state in seen:
            break
        seen.add(state)
    while out:
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            out.pop()
    return ""


class AutomataTable:
    """Every device automaton's tables in one pair of device tensors, so a batch's masks and
    next states are one gather each: global state 0 allows every token and stays 0 (a row
    whose request ended, or an unwritten state), an automaton's states follow at its `base`.
    Automata are added on the compile threads (`add`) and copied to the device on first use
    (`tables`)."""

    def __init__(self, vocab_size: int, budget_bytes: int = DEVICE_TABLE_BYTES):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.capacity = max(budget_bytes // (4 * (vocab_size + self.words)), 1)
        self.used = 1
        self._waiting: list[tuple[int, TokenAutomaton]] = []
        self._lock = threading.Lock()
        self.next_state: torch.Tensor | None = None     # [rows, vocab] int32 global states
        self.allowed: torch.Tensor | None = None        # [rows, words] int32

    def add(self, automaton: TokenAutomaton) -> int | None:
        """The automaton's base (its state s is global state base + s); None when the tables
        are full."""
        with self._lock:
            if self.used + automaton.num_states > self.capacity:
                return None
            base, self.used = self.used, self.used + automaton.num_states
            self._waiting.append((base, automaton))
            return base

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(next_state, allowed) on the device, with every automaton added so far."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            used = self.used
        if self.next_state is None or self.next_state.shape[0] < used:
            rows = min(max(64, 1 << (used - 1).bit_length()), max(self.capacity, used))
            nxt = torch.zeros((rows, self.vocab_size), dtype=torch.int32, device=device)
            allowed = torch.full((rows, self.words), -1, dtype=torch.int32, device=device)
            if self.next_state is not None:
                old = self.next_state.shape[0]
                nxt[:old], allowed[:old] = self.next_state, self.allowed
            self.next_state, self.allowed = nxt, allowed
        for base, a in waiting:
            n = a.num_states
            local = torch.from_numpy(a.next_state)
            glob = torch.where((local >= 0) & (local < n), local + base, 0).to(torch.int32)
            self.next_state[base:base + n] = to_device(glob, torch.int32, device)
            self.allowed[base:base + n] = to_device(a.allowed, torch.int32, device)
        return self.next_state, self.allowed
