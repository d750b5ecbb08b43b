"""A regular grammar as a deterministic automaton over bytes, read from xgrammar's serialized
grammar (so the language is exactly the one xgrammar parsed: the same regex or EBNF reading).

Why: a grammar that is a finite automaton can run on the device (constrained/token_automaton.py):
its mask at a state is a table row, and its next state a table lookup, with no host call per
request and step. Regexes are the common case. xgrammar writes `a+` as a right-recursive rule
(`r ::= a r | a`), which is still regular: a rule reference in tail position (what follows it is
what follows the rule) is a jump back to the rule's start. Any other recursion (nesting, as in
JSON), a lookahead, a tag dispatch or a grammar past the size caps raises NotRegular and the
grammar stays on xgrammar's host matcher.

Construction: an NFA by continuation passing (each expression is built knowing the state that
follows it, so a tail reference to a rule being built with the same continuation closes a loop),
character classes as UTF-8 byte sequences, then the subset construction over byte classes.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

# Expression kinds of xgrammar's serialized grammar ("grammar_expr_data": [kind, payload length,
# payload...]), as constrained/alphabet.py reads them.
_BYTES, _CLASS, _CLASS_STAR, _EMPTY, _RULE, _SEQUENCE, _CHOICES, _REPEAT = 0, 1, 2, 3, 4, 5, 6, 8
MAX_CODEPOINT = 0x10FFFF
MAX_NFA_STATES = 20_000
MAX_DFA_STATES = 256     # a token table is a row of the vocabulary per state: keep them few
MAX_REPEAT = 256         # x{m,n} is unrolled: n copies


class NotRegular(ValueError):
    """The grammar is not (or not read as) a small finite automaton."""


@dataclass
class ByteDFA:
    """next_state[s, byte] (-1: no match); state 0 starts; accepting[s]: the grammar may end."""
    next_state: np.ndarray      # [states, 256] int32
    accepting: np.ndarray       # [states] bool

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])


class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []   # (low byte, high byte, target)

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise NotRegular("too many automaton states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


def _utf8_digits(cp: int, n: int) -> list[int]:
    """`cp` as the n digits of its n-byte UTF-8 form: the lead byte's payload, then 6-bit
    continuation payloads."""
    digits = []
    for _ in range(n - 1):
        digits.append(cp & 63)
        cp >>= 6
    return [cp] + digits[::-1]


def _digit_ranges(lo: list[int], hi: list[int]) -> list[list[tuple[int, int]]]:
    """Sequences of per-digit ranges covering the digit strings from lo to hi (continuation
    digits run 0-63)."""
    if len(lo) == 1:
        return [[(lo[0], hi[0])]]
    if lo[0] == hi[0]:
        return [[(lo[0], lo[0])] + r for r in _digit_ranges(lo[1:], hi[1:])]
    tail = len(lo) - 1
    low_full, high_full = all(d == 0 for d in lo[1:]), all(d == 63 for d in hi[1:])
    out = []
    if not low_full:
        out += [[(lo[0], lo[0])] + r for r in _digit_ranges(lo[1:], [63] * tail)]
    first, last = lo[0] + (not low_full), hi[0] - (not high_full)
    if first <= last:
        out.append([(first, last)] + [(0, 63)] * tail)
    if not high_full:
        out += [[(hi[0], hi[0])] + r for r in _digit_ranges([0] * tail, hi[1:])]
    return out


_LENGTHS = ((0, 0x7F, 1, 0x00), (0x80, 0x7FF, 2, 0xC0), (0x800, 0xFFFF, 3, 0xE0),
            (0x10000, MAX_CODEPOINT, 4, 0xF0))


def utf8_byte_ranges(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The codepoints lo..hi as sequences of byte ranges (each sequence one UTF-8 length)."""
    out = []
    for first, last, n, lead in _LENGTHS:
        a, b = max(lo, first), min(hi, last)
        if a > b:
            continue
        for seq in _digit_ranges(_utf8_digits(a, n), _utf8_digits(b, n)):
            out.append([(lead | seq[0][0], lead | seq[0][1])]
                       + [(0x80 | x, 0x80 | y) for x, y in seq[1:]])
    return out


def _class_ranges(payload: list[int]) -> list[tuple[int, int]]:
    negated, bounds = payload[0], payload[1:]
    listed = sorted((low, min(high, MAX_CODEPOINT)) for low, high in zip(bounds[::2], bounds[1::2]))
    if not negated:
        return listed
    out, start = [], 0
    for low, high in listed:
        if low > start:
            out.append((start, low - 1))
        start = max(start, high + 1)
    if start <= MAX_CODEPOINT:
        out.append((start, MAX_CODEPOINT))
    return out


class _Builder:
    def __init__(self, tree: dict) -> None:
        self.data: list[int] = tree["grammar_expr_data"]
        self.starts: list[int] = tree["grammar_expr_indptr"]
        self.rules = tree["rules"]
        for rule in self.rules:
            if len(rule) > 2 and rule[2] != -1:
                raise NotRegular("a rule with a lookahead")
        self.nfa = _NFA()
        self.rule_starts: dict[tuple[int, int], int] = {}
        self.building: set[int] = set()

    def expr(self, i: int) -> tuple[int, list[int]]:
        # (the index lists each expression's start; the last one runs to the data's end)
        begin = self.starts[i]
        end = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.data)
        kind, size = self.data[begin], self.data[begin + 1]
        payload = self.data[begin + 2:end]
        if len(payload) != size:
            raise NotRegular("an expression layout this does not read")
        return kind, payload

    def build(self, i: int, cont: int) -> int:
        """A state from which expression i, then `cont`, is matched."""
        kind, payload = self.expr(i)
        nfa = self.nfa
        if kind == _BYTES:
            state = cont
            for byte in reversed(payload):
                s = nfa.new()
                nfa.edges[s].append((byte, byte, state))
                state = s
            return state
        if kind in (_CLASS, _CLASS_STAR):
            start = nfa.new()
            target = start if kind == _CLASS_STAR else cont
            if kind == _CLASS_STAR:
                nfa.eps[start].append(cont)
            for low, high in _class_ranges(payload):
                for seq in utf8_byte_ranges(low, high):
                    self._byte_sequence(start, seq, target)
            return start
        if kind == _EMPTY:
            return cont
        if kind == _SEQUENCE:
            state = cont
            for j in reversed(payload):
                state = self.build(j, state)
            return state
        if kind == _CHOICES:
            start = nfa.new()
            for j in payload:
                nfa.eps[start].append(self.build(j, cont))
            return start
        if kind == _RULE:
            return self.rule(payload[0], cont)
        if kind == _REPEAT:
            rule, low, high = payload
            if low > MAX_REPEAT or high > MAX_REPEAT:
                raise NotRegular("a repetition too long to unroll")
            state = cont
            if high == -1:            # x{low,}: a loop, then low copies
                loop = nfa.new()
                nfa.eps[loop] += [cont, self.rule(rule, loop)]
                state = loop
            else:
                for _ in range(high - low):    # optional copies
                    skip = nfa.new()
                    nfa.eps[skip] += [state, self.rule(rule, state)]
                    state = skip
            for _ in range(low):
                state = self.rule(rule, state)
            return state
        raise NotRegular(f"an expression of kind {kind}")

    def _byte_sequence(self, start: int, seq: list[tuple[int, int]], target: int) -> None:
        state = start
        for k, (low, high) in enumerate(seq):
            nxt = target if k == len(seq) - 1 else self.nfa.new()
            self.nfa.edges[state].append((low, high, nxt))
            state = nxt

    def rule(self, rule: int, cont: int) -> int:
        key = (rule, cont)
        start = self.rule_starts.get(key)
        if start is not None:
            return start       # built, or being built with this continuation: a loop
        if rule in self.building:
            raise NotRegular("a recursive rule outside tail position")
        start = self.rule_starts[key] = self.nfa.new()
        self.building.add(rule)
        self.nfa.eps[start].append(self.build(self.rules[rule][1], cont))
        self.building.discard(rule)
        return start


def _closure(nfa: _NFA, states: frozenset[int] | set[int]) -> frozenset[int]:
    seen, todo = set(states), list(states)
    while todo:
        for t in nfa.eps[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return frozenset(seen)


def byte_dfa(serialized: str) -> ByteDFA:
    """The grammar's DFA over bytes. Raises NotRegular."""
    try:
        tree = json.loads(serialized)
        builder = _Builder(tree)
        nfa = builder.nfa
        end = nfa.new()
        start = builder.rule(tree["root_rule_id"], end)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        if isinstance(e, NotRegular):
            raise
        raise NotRegular(f"a grammar layout this does not read ({e})") from None
    except RecursionError:
        raise NotRegular("a grammar nested too deeply") from None
    # Byte classes: bytes no edge tells apart move alike.
    cuts = {0, 256}
    for edges in nfa.edges:
        for low, high, _ in edges:
            cuts.update((low, high + 1))
    bounds = sorted(cuts)
    reps = bounds[:-1]
    sets = [_closure(nfa, {start})]
    index = {sets[0]: 0}
    rows: list[list[int]] = []
    k = 0
    while k < len(sets):
        moves: list[set[int]] = [set() for _ in reps]
        for s in sets[k]:
            for low, high, target in nfa.edges[s]:
                for c in range(bisect_left(reps, low), bisect_right(reps, high)):
                    moves[c].add(target)
        row = []
        for move in moves:
            if not move:
                row.append(-1)
                continue
            closed = _closure(nfa, move)
            if closed not in index:
                if len(sets) >= MAX_DFA_STATES:
                    raise NotRegular("too many automaton states")
                index[closed] = len(sets)
                sets.append(closed)
            row.append(index[closed])
        rows.append(row)
        k += 1
    widths = np.diff(np.array(bounds))
    next_state = np.repeat(np.array(rows, dtype=np.int32).reshape(len(sets), len(reps)),
                           widths, axis=1)
    accepting = np.array([end in s for s in sets], dtype=bool)
    return ByteDFA(next_state, accepting)
