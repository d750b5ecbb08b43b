"""Tokens a grammar can never accept, known from the characters it can ever produce.

A constrained request that samples without its grammar mask (scheduler/grammar_sampling.py)
loses a step whenever the grammar rejects its token. Many rejections are of tokens that no state
of the grammar accepts: a newline under `[a-zA-Z ,.]+`, a quote in a number, a control character
in compact JSON. Which those are does not depend on the request's state, so a mask of them is
computed once per grammar and applied on the device every step, at no host cost per step. The
mask removes only tokens the grammar rejects in every state, so an unmasked draw under it is
still exactly masked sampling's token whenever the grammar accepts it.

How: every character a grammar matches comes from one of its terminals, a byte string or a
character class, and xgrammar's serialized grammar lists them all. Only ASCII is tracked: a byte
below 0x80 in a token's UTF-8 is always that ASCII character, so a token holding an ASCII byte
outside the grammar's alphabet can never be accepted. A grammar with an expression this does not
read (the TagDispatch of structural tags: any text; a JSON schema's `pattern`, an inline regex)
gives no mask.
"""

from __future__ import annotations

import json
import threading
from typing import Sequence

import numpy as np
import torch

from radixlm.utils.device import to_device

ASCII = frozenset(range(128))

# Expression kinds of xgrammar's serialized grammar (Grammar.serialize_json: "grammar_expr_data",
# each expression [kind, payload length, payload...]) that hold terminals, and those that only
# give structure. Any other kind (TagDispatch: any text; an inline Regex; token sets) gives no
# alphabet, and so no static mask.
_BYTES, _CLASS, _CLASS_STAR = 0, 1, 2
_STRUCTURE = {3, 4, 5, 6, 8}     # empty string, rule reference, sequence, choices, repetition
# Larger serialized grammars (a schema with an enum of 20,000 values) are not read: the walk
# below holds the GIL on the compile thread, and the scheduler's loop waits for it.
MAX_SERIALIZED_CHARS = 1 << 20


def ascii_alphabet(serialized: str) -> frozenset[int] | None:
    """The ASCII characters a grammar can match anywhere, from its serialized form (the printed
    EBNF is not exact: xgrammar 0.2.9 prints `[\\^a]` as `[^a]` and cuts a string literal at a
    NUL). None when the grammar holds an expression this does not understand, or is too
    large."""
    if len(serialized) > MAX_SERIALIZED_CHARS:
        return None
    try:
        tree = json.loads(serialized)
        data, starts = tree["grammar_expr_data"], tree["grammar_expr_indptr"]
    except (ValueError, KeyError, TypeError):
        return None
    alphabet: set[int] = set()
    # (the index lists each expression's start; the last one runs to the data's end)
    for begin, end in zip(starts, list(starts[1:]) + [len(data)]):
        expr = data[begin:end]
        if len(expr) < 2 or len(expr) != expr[1] + 2:
            return None          # (not the layout this reads: a format this does not know)
        kind = expr[0]
        if kind == _BYTES:
            alphabet.update(b for b in expr[2:] if b < 128)
        elif kind in (_CLASS, _CLASS_STAR):
            if expr[1] < 1 or (expr[1] - 1) % 2:
                return None
            listed: set[int] = set()
            for low, high in zip(expr[3::2], expr[4::2]):
                listed.update(range(low, min(high, 127) + 1))
            alphabet.update(ASCII - listed if expr[2] else listed)
        elif kind not in _STRUCTURE:
            return None
    return frozenset(alphabet)


def token_bitmask(allowed: np.ndarray) -> torch.Tensor:
    """Boolean rows over the vocabulary ([..., vocab]) as xgrammar-layout bitmasks: int32 words,
    bit t % 32 of word t // 32 set = token t allowed, the last word padded with zeros."""
    words = (allowed.shape[-1] + 31) // 32
    bits = np.packbits(allowed, axis=-1, bitorder="little")
    pad = [(0, 0)] * (bits.ndim - 1) + [(0, words * 4 - bits.shape[-1])]
    bits = np.ascontiguousarray(np.pad(bits, pad))
    return torch.from_numpy(bits.view("<i4").copy())


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
        return token_bitmask(~banned)


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
