"""Turn the engine's logprob entries into OpenAI's two logprob formats.

The engine gives, per position, `[logprob, token_id, text]` (text = the token decoded alone,
because we always ask for return_text_in_logprobs) and, per position, a list of such entries for
the top alternatives (best first), or None where there is none (the first prompt token).

- Completions use the legacy object: parallel lists `tokens`, `token_logprobs`, `top_logprobs`
  (dicts token -> logprob that, as OpenAI documents, also hold the sampled token) and
  `text_offset`.
- Chat uses a list of {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}.
"""

from __future__ import annotations

import codecs
import math
import re
from functools import lru_cache
from typing import Any, Optional, Sequence

from radixlm.entrypoints.openai.response_models import (ChatTokenLogprob, CompletionLogprobs,
                                                        TopLogprob)

Entry = Sequence[Any]  # [logprob | None, token_id, text | None]

# JSON has no -inf; OpenAI reports impossible tokens with this floor.
LOGPROB_FLOOR = -9999.0
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def clean_logprob(lp: Optional[float]) -> Optional[float]:
    if lp is None:
        return None
    lp = float(lp)
    if math.isnan(lp) or lp < LOGPROB_FLOOR:
        return LOGPROB_FLOOR
    return lp


def _text(entry: Entry) -> str:
    return entry[2] if len(entry) > 2 and entry[2] is not None else ""


# ---------------------------------------------------------------------------- completions

class TextOffsets:
    """Where each token starts in a choice's text, in characters. The tokens' bytes go through
    an incremental UTF-8 decoder: a token that is part of a character (an emoji in two tokens)
    adds no character until the one that completes it, so the next token's offset stays right;
    a token starting mid-character gets the offset of that character. Kept per choice across
    the chunks of a stream."""

    def __init__(self, start: int = 0):
        self.offset = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, raw: bytes) -> int:
        """The offset of a token of bytes `raw`, which then counts as read."""
        at = self.offset
        self.offset += len(self._decoder.decode(raw))
        return at


def extend_completion_logprobs(out: CompletionLogprobs, entries: Sequence[Entry],
                               tops: Optional[Sequence[Optional[Sequence[Entry]]]],
                               offsets: TextOffsets, tokenizer: Any) -> None:
    """Append `entries` to `out`, their text_offset from `offsets` (the choice's). `tops` is
    None when no alternatives were asked for. A token that is part of a UTF-8 character is
    named `bytes:\\xNN...` (as OpenAI names them, and chat here), so alternatives that are
    different byte pieces stay distinct keys of `top_logprobs`."""
    for i, entry in enumerate(entries):
        lp = clean_logprob(entry[0])
        token, raw = token_bytes(tokenizer, entry[1], _text(entry))
        out.tokens.append(token)
        out.token_logprobs.append(lp)
        out.text_offset.append(offsets.advance(bytes(raw)))
        alternatives = tops[i] if tops is not None and i < len(tops) else None
        if lp is None:  # the first prompt token: nothing to rank
            out.top_logprobs.append(None)
            continue
        ranked: dict[str, float] = {}
        for alt in alternatives or ():
            ranked.setdefault(token_bytes(tokenizer, alt[1], _text(alt))[0],
                              clean_logprob(alt[0]))
        ranked.setdefault(token, lp)  # the sampled token is always listed
        out.top_logprobs.append(ranked)


# ---------------------------------------------------------------------------- chat

@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2 style byte-level BPE spells each byte as a printable character: bytes that are
    printable Latin-1 stand for themselves, the others are shifted to code points from 256 up.
    Inverting that lets us report a token's true bytes even when it is half a UTF-8 character."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


def token_bytes(tokenizer: Any, token_id: int, text: str) -> tuple[str, list[int]]:
    """(token string, its UTF-8 bytes). A token that ends mid-character decodes to U+FFFD; we
    then recover its raw bytes from the vocabulary and name it `bytes:\\xNN...` as OpenAI does."""
    if "\ufffd" not in text or tokenizer is None:
        return text, list(text.encode("utf-8"))
    try:
        piece = tokenizer.convert_ids_to_tokens(int(token_id))
    except Exception:  # not every tokenizer can; fall back to the decoded text
        piece = None
    raw: Optional[bytes] = None
    if isinstance(piece, str):
        m = _BYTE_TOKEN.match(piece)  # SentencePiece byte-fallback token
        alphabet = _byte_level_alphabet()
        if m:
            raw = bytes([int(m.group(1), 16)])
        elif piece and all(c in alphabet for c in piece):
            raw = bytes(alphabet[c] for c in piece)
    if raw is None:
        return text, list(text.encode("utf-8"))
    try:
        return raw.decode("utf-8"), list(raw)
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)


def chat_logprobs(entries: Sequence[Entry], tops: Optional[Sequence[Optional[Sequence[Entry]]]],
                  tokenizer: Any) -> list[ChatTokenLogprob]:
    out = []
    for i, entry in enumerate(entries):
        token, raw = token_bytes(tokenizer, entry[1], _text(entry))
        alternatives = []
        for alt in (tops[i] if tops is not None and i < len(tops) and tops[i] else ()):
            alt_token, alt_raw = token_bytes(tokenizer, alt[1], _text(alt))
            alternatives.append(TopLogprob(token=alt_token, logprob=clean_logprob(alt[0]),
                                           bytes=alt_raw))
        lp = clean_logprob(entry[0])
        out.append(ChatTokenLogprob(token=token, logprob=LOGPROB_FLOOR if lp is None else lp,
                                    bytes=raw, top_logprobs=alternatives))
    return out
