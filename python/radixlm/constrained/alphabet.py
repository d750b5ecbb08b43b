"""Tokens a grammar can never accept, known from the characters it can ever produce.

A constrained request that samples without its grammar mask (scheduler/grammar_sampling.py)
loses a step whenever the grammar rejects its token. Many rejections are of tokens that no state
of the grammar accepts: a newline under `[a-zA-Z ,.]+`, a quote in a number, a control character
in compact JSON. Which those are does not depend on the request's state, so a mask of them is
computed once per grammar and applied on the device every step, at no host cost per step. The
mask removes only tokens the grammar rejects in every state, so an unmasked draw under it is
still exactly masked sampling's token whenever the grammar accepts it.

How: every character a grammar matches comes from one of its terminals, a string literal or a
character class; the grammar's printed EBNF (xgrammar's normalised form) lists them all. Only
ASCII is tracked: a byte below 0x80 in a token's UTF-8 is always that ASCII character, so a token
holding an ASCII byte outside the grammar's alphabet can never be accepted. Text the parser does
not understand (xgrammar's TagDispatch of structural tags, an unknown escape) gives no mask.
"""

from __future__ import annotations

import re
import threading
from typing import Sequence

import numpy as np
import torch

from radixlm.utils.device import to_device

ASCII = frozenset(range(128))

_SIMPLE_ESCAPES = {"t": 9, "n": 10, "r": 13, "f": 12, "v": 11, "0": 0, "a": 7, "b": 8, "e": 27}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
# What may stand between the terminals of printed EBNF: rule names, `::=`, grouping,
# alternatives, repetition (`*`, `+`, `?`, `{0, 10}`) and lookaheads `(=(...))`.
_STRUCTURE = re.compile(r"[\w\s:=()|*+?{},]*")
_CALL = re.compile(r"\w\(")   # a builtin such as TagDispatch(...): its text is not terminals


def _read_char(text: str, i: int) -> tuple[int, int] | None:
    """The code point at text[i] (an escape or a plain character) and the index after it;
    None for an escape this parser does not know."""
    if text[i] != "\\":
        return ord(text[i]), i + 1
    if i + 1 >= len(text):
        return None
    c = text[i + 1]
    if c in _HEX_DIGITS:
        digits = text[i + 2:i + 2 + _HEX_DIGITS[c]]
        if len(digits) != _HEX_DIGITS[c] or not all(d in "0123456789abcdefABCDEF"
                                                    for d in digits):
            return None
        return int(digits, 16), i + 2 + len(digits)
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    if c.isalnum():
        return None   # (an escape class like \d: not in xgrammar's printed form)
    return ord(c), i + 2   # an escaped punctuation mark stands for itself


def _literal(text: str, i: int, into: set[int]) -> int | None:
    """Read the string literal opening at text[i] (a quote); add its ASCII characters."""
    i += 1
    while i < len(text) and text[i] != '"':
        got = _read_char(text, i)
        if got is None:
            return None
        code, i = got
        if code < 128:
            into.add(code)
    return i + 1 if i < len(text) else None


def _char_class(text: str, i: int, into: set[int]) -> int | None:
    """Read the character class opening at text[i] (`[`); add the ASCII characters it matches
    (for `[^...]`, all those it does not list)."""
    i += 1
    negated = i < len(text) and text[i] == "^"
    i += negated
    listed: set[int] = set()
    while i < len(text) and text[i] != "]":
        got = _read_char(text, i)
        if got is None:
            return None
        low, i = got
        high = low
        if i + 1 < len(text) and text[i] == "-" and text[i + 1] != "]":
            got = _read_char(text, i + 1)
            if got is None:
                return None
            high, i = got
        listed.update(range(low, min(high, 127) + 1))
    if i >= len(text):
        return None
    into.update(ASCII - listed if negated else listed)
    return i + 1


def ascii_alphabet(ebnf: str) -> frozenset[int] | None:
    """The ASCII characters the grammar printed as `ebnf` can match anywhere; None when the
    text holds a construct this parser does not understand."""
    alphabet: set[int] = set()
    structure: list[str] = []
    i = 0
    while i < len(ebnf):
        c = ebnf[i]
        if c == '"':
            nxt = _literal(ebnf, i, alphabet)
        elif c == "[":
            nxt = _char_class(ebnf, i, alphabet)
        else:
            structure.append(c)
            nxt = i + 1
        if nxt is None:
            return None
        i = nxt
    rest = "".join(structure)
    if not _STRUCTURE.fullmatch(rest) or _CALL.search(rest):
        return None
    return frozenset(alphabet)


class TokenAsciiIndex:
    """For each ASCII character, which token ids hold it (from the tokens' decoded bytes)."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int):
        self.vocab_size = vocab_size
        tokens = list(decoded_vocab)[:vocab_size]
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        flat = np.frombuffer(b"".join(tokens), dtype=np.uint8)
        owner = np.repeat(np.arange(len(tokens)), lengths)
        ascii_ = flat < 128
        self.holds = np.zeros((128, vocab_size), dtype=bool)
        self.holds[flat[ascii_], owner[ascii_]] = True
        self.decoded = len(tokens)

    def allowed_bits(self, forbidden: frozenset[int], never: Sequence[int],
                     always: Sequence[int]) -> torch.Tensor:
        """An xgrammar-layout bitmask row (int32, bit t % 32 of word t // 32 set = token t
        allowed) that bans the tokens holding a `forbidden` character, and `never`; `always`
        (the stop tokens) stay allowed."""
        banned = (self.holds[sorted(forbidden)].any(axis=0) if forbidden
                  else np.zeros(self.vocab_size, dtype=bool))
        banned[self.decoded:] = True          # ids past the tokenizer's: padding
        banned[list(never)] = True
        banned[list(always)] = False
        words = (self.vocab_size + 31) // 32
        bits = np.packbits(~banned, bitorder="little")
        bits = np.concatenate([bits, np.zeros(words * 4 - bits.size, dtype=np.uint8)])
        return torch.from_numpy(bits.view("<i4").copy())


class StaticMaskTable:
    """The static masks on the device: one row per distinct set of forbidden characters (many
    grammars share one: every compact-JSON schema bans control characters), row 0 allowing
    every token. Rows are computed on the compile threads (`row_for`) and copied to the device
    on first use (`gather`). At most CAPACITY rows; grammars beyond get row 0 (no mask)."""

    CAPACITY = 256

    def __init__(self, index: TokenAsciiIndex, never: Sequence[int], always: Sequence[int]):
        self.index = index
        self.never, self.always = list(never), list(always)
        words = (index.vocab_size + 31) // 32
        self._host: list[torch.Tensor] = [torch.full((words,), -1, dtype=torch.int32)]
        self._rows: dict[frozenset[int], int] = {frozenset(): 0}
        self._lock = threading.Lock()
        self._device: torch.Tensor | None = None
        self._device_key: torch.device | None = None
        self._uploaded = 0
        # (rows, the device asked for, the result): `device` as given ("cuda" is not the
        # result's "cuda:0"), so a repeat is recognised.
        self._last: tuple[list[int], torch.device, torch.Tensor] | None = None

    def row_for(self, alphabet: frozenset[int] | None) -> int:
        """The row banning every token with an ASCII character outside `alphabet` (0 for None:
        unknown alphabet, nothing banned)."""
        forbidden = frozenset() if alphabet is None else ASCII - alphabet
        with self._lock:
            row = self._rows.get(forbidden)
            if row is not None:
                return row
            if len(self._host) >= self.CAPACITY:
                return 0
        bits = self.index.allowed_bits(forbidden, self.never, self.always)
        with self._lock:
            row = self._rows.get(forbidden)
            if row is None and len(self._host) < self.CAPACITY:
                row = self._rows[forbidden] = len(self._host)
                self._host.append(bits)
            return row or 0

    def gather(self, rows: list[int], device: torch.device) -> torch.Tensor | None:
        """[len(rows), words] on `device`: row i is the static mask number rows[i]. None when
        every row is 0. The last result is reused while the rows repeat (a decode batch's do,
        step after step); callers must not write to it."""
        if not any(rows):
            return None
        if self._last is not None and self._last[0] == rows and self._last[1] == device:
            return self._last[2]
        with self._lock:
            host = list(self._host)
        if self._device is None or self._device_key != device:
            self._device_key = device
            self._device = torch.empty((self.CAPACITY, host[0].numel()), dtype=torch.int32,
                                       device=device)
            self._uploaded = 0
        if self._uploaded < len(host):
            self._device[self._uploaded:len(host)] = to_device(
                torch.stack(host[self._uploaded:]), torch.int32, device)
            self._uploaded = len(host)
        out = self._device.index_select(0, to_device(rows, torch.int64, device))
        self._last = (list(rows), device, out)
        return out
