"""Incremental detokenization and stop-string matching (pure logic, no processes).

Two consumers share one windowed decoder:

- `IncrementalDetokenizer` turns a request's output token ids into the text deltas streamed to the
  client. It never emits half a UTF-8 character and never leaks a stop string that is still being
  spelled out over several tokens.
- `StopStringChecker` lives in the scheduler and only answers "does the output now contain a stop
  string?", so the request can finish on the very step the stop string completes.

Both treat a `stop_regex` match (sampling/stop_regex.py) as a stop string spelled by a pattern.

Why a window instead of `decode(all_ids)` every step: decoding is O(output length), which makes a
long generation quadratic. We decode `ids[prefix_offset:]` and subtract the text of
`ids[prefix_offset:read_offset]`. Keeping a few already-emitted tokens in front (the prefix)
matters for tokenizers whose decoder treats the first token of a sequence specially (SentencePiece
strips its leading "▁" space); decoding the new tokens alone would lose that space.

Why the replacement character: byte-level BPE tokens can end in the middle of a multi-byte UTF-8
character; decoding such a tail yields U+FFFD. We keep those tokens unread until a later token
completes the character (or the request finishes, when whatever remains is emitted as is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlm.sampling.stop_regex import StopRegexes

REPLACEMENT_CHAR = "\ufffd"


def find_stop_string(
    text: str, stops: Sequence[str], search_from: int = 0, end_after: int = 0
) -> tuple[int, str] | None:
    """Earliest occurrence of any stop string in `text[search_from:]` that ends past index
    `end_after` (its last character at or after it: occurrences wholly before are not matches,
    e.g. text the first min_new_tokens - 1 tokens produced, or already searched).

    Returns (start index in `text`, matched string), or None. Earliest start wins; when two stop
    strings start at the same index the longer wins, so ["wor", "world"] on "hello world" reports
    "world" (the output is cut at the same place either way, but `matched` is the more specific).
    Empty stop strings are ignored: they would match everywhere.
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        pos = text.find(stop, max(search_from, end_after - len(stop) + 1, 0))
        if pos < 0:
            continue
        if best is None or pos < best[0] or (pos == best[0] and len(stop) > len(best[1])):
            best = (pos, stop)
    return best


def find_stop(text: str, stops: Sequence[str], regexes: StopRegexes | None,
              end_after: int = 0) -> tuple[int, str] | None:
    """find_stop_string over the stop strings and the stop_regex patterns together: the
    earliest match (the longer when two start together), as (start, matched text), or None."""
    hit = find_stop_string(text, stops, end_after=end_after) if stops else None
    other = regexes.find(text, end_after) if regexes is not None else None
    if other is None:
        return hit
    if hit is None or other[0] < hit[0] or (other[0] == hit[0] and len(other[1]) > len(hit[1])):
        return other
    return hit


def stop_prefix_suffix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    That suffix may be the start of a stop string whose remaining characters arrive with later
    tokens, so the streamer must hold it back. Cost is O(sum of len(stop)^2), tiny for real stops.
    """
    best = 0
    for stop in stops:
        # A full match would already have been reported, so only proper prefixes count.
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


@dataclass
class WindowDecoder:
    """Decodes a growing list of token ids a few tokens at a time.

    `pending()` is the text the ids after `read_offset` add; `commit()` marks it as consumed. The
    invariant that makes the window sound: a commit only happens when the decoded text does not end
    in U+FFFD, i.e. the byte stream is at a character boundary, so decoding can restart there and
    agree with a decode of the whole sequence.
    """

    tokenizer: Any
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    ids: list[int] = field(default_factory=list)
    # ids[prefix_offset:read_offset] are already consumed but kept as decoding context.
    prefix_offset: int = 0
    read_offset: int = 0
    # decode(ids[prefix_offset:read_offset]), cached so each step decodes the window only once
    # more; None means "recompute" (after a commit moved the window).
    _prefix_text: str | None = ""
    # decode(ids[prefix_offset:]) from the last pending() call, valid until ids change.
    _window_text: str | None = None
    # len(tokenizer), looked up once (-1: unknown, no filtering).
    _limit: int | None = None

    def _tokenizer_len(self) -> int:
        if self._limit is None:
            try:
                self._limit = len(self.tokenizer)
            except TypeError:
                self._limit = -1
        return self._limit

    def decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        ids = list(ids)
        # A model whose vocabulary is larger than its tokenizer's (a --load-format dummy config
        # served with another model's tokenizer; padded embedding rows) samples ids that have
        # no text: they decode as nothing. Fast tokenizers skip them already, slow ones raise.
        limit = self._tokenizer_len()
        if limit >= 0 and max(ids) >= limit:
            ids = [i for i in ids if i < limit]
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def append(self, new_ids: Sequence[int]) -> None:
        if new_ids:
            self.ids.extend(int(i) for i in new_ids)
            self._window_text = None

    def pending(self) -> str:
        """Text added by the unread ids; may end in U+FFFD while a character is incomplete."""
        if self.read_offset >= len(self.ids):
            return ""
        if self._prefix_text is None:
            self._prefix_text = self.decode(self.ids[self.prefix_offset : self.read_offset])
        if self._window_text is None:
            self._window_text = self.decode(self.ids[self.prefix_offset :])
        window = self._window_text
        if len(window) <= len(self._prefix_text):
            # Nothing visible yet (e.g. only skipped special tokens). Slicing by length rather than
            # comparing strings is deliberate: with a clean boundary the window extends the prefix.
            return ""
        return window[len(self._prefix_text) :]

    def commit(self) -> None:
        """Consume every id so far; the old read point becomes the new context start."""
        if self.read_offset >= len(self.ids):
            return
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self._prefix_text = None
        self._window_text = None

    def is_stable(self, text: str) -> bool:
        """Whether `text` (from pending()) can be committed: non-empty, no broken final char."""
        return bool(text) and not text.endswith(REPLACEMENT_CHAR)


class IncrementalDetokenizer:
    """Streams one request's output as text deltas.

    `push(new_ids, finished)` returns the delta to emit now; the concatenation of all deltas is
    `text`. Without stop strings it equals `tokenizer.decode(all_ids, skip_special_tokens=...)`.

    With stop strings, the longest suffix that could begin a stop string is held back. When a stop
    string appears, `text` ends right before it (right after with `no_stop_trim`), `matched_stop`
    records it and every later push returns "". Within one push the earliest-starting match wins;
    across pushes the first match to complete wins (that is when the scheduler stops the request).
    With `min_new_tokens`, a stop string counts only if it ends in the text of token
    min_new_tokens or a later one, as the scheduler checks it (StopStringChecker.skip).
    `finished=True` releases held-back text and any incomplete trailing character.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: Sequence[str] = (),
        no_stop_trim: bool = False,
        min_new_tokens: int = 0,
        stop_regex: Sequence[str] = (),
    ) -> None:
        self._decoder = WindowDecoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self.stops: tuple[str, ...] = tuple(s for s in (stop or ()) if s)
        self.regexes = StopRegexes.compile(stop_regex)
        self.no_stop_trim = no_stop_trim
        self.min_new_tokens = min_new_tokens
        # Where in the whole output text a stop string may end (past it), once min_new_tokens
        # ids have come: len(text of the first min_new_tokens - 1 ids). None: not yet.
        self._stops_from: int | None = 0 if min_new_tokens <= 1 else None
        self._max_stop_len = max((len(s) for s in self.stops), default=0)
        # Emitted text kept to search with new text: a stop string's length - 1 in no_stop_trim
        # mode (a match may begin in it); a regex's window in both (its lookbehind may see it).
        self._tail_len = max(self._max_stop_len - 1 if no_stop_trim else 0,
                             self.regexes.window if self.regexes else 0)
        self.matched_stop: str | None = None
        self.finished = False
        # Decoded but unemitted text that may be the start of a stop string (trim mode only).
        self._held = ""
        # The last emitted characters, searched together with new text in no_stop_trim mode,
        # where nothing is held back and a stop string can begin inside already-emitted text.
        self._tail = ""
        self._chunks: list[str] = []
        self._text_cache = ""

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._chunks:
            self._text_cache += "".join(self._chunks)
            self._chunks.clear()
        return self._text_cache

    @property
    def output_ids(self) -> list[int]:
        return self._decoder.ids

    def push(self, new_ids: Sequence[int], finished: bool) -> str:
        if self.finished:
            return ""
        self._decoder.append(new_ids)
        if self._stops_from is None and len(self._decoder.ids) >= self.min_new_tokens:
            self._stops_from = len(self._decoder.decode(
                self._decoder.ids[: self.min_new_tokens - 1]))
        new_text = self._decoder.pending()
        if finished or self._decoder.is_stable(new_text):
            self._decoder.commit()
        else:
            new_text = ""
        delta = (self._apply_stops(new_text, finished) if self.stops or self.regexes
                 else new_text)
        if finished:
            self.finished = True
        if delta:
            self._chunks.append(delta)
        return delta

    def _apply_stops(self, new_text: str, finished: bool) -> str:
        pending = self._held + new_text
        if not pending:
            return ""
        base = len(self._tail)
        searched = self._tail + pending
        hit = None
        if self._stops_from is not None:
            # searched[0] is character len(text) - len(tail) of the whole output; a match
            # wholly in the tail was found (or skipped) before
            hit = find_stop(searched, self.stops, self.regexes,
                            end_after=max(self._stops_from - (len(self.text) - base), base))
        if hit is not None:
            pos, stop = hit
            end = pos + len(stop) if self.no_stop_trim else pos
            self.matched_stop = stop
            self.finished = True
            self._held = ""
            # In trim mode a match never starts in emitted text (that text was not a stop prefix
            # when it was released); in no_stop_trim mode the tail holds no complete match. So
            # `end >= base`; max() only guards the invariant.
            return searched[base : max(end, base)]
        if finished or self.no_stop_trim:
            delta, self._held = pending, ""
        else:
            keep = stop_prefix_suffix_len(pending, self.stops)
            if self.regexes is not None:
                keep = max(keep, min(self.regexes.hold_len(searched), len(pending)))
            delta, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        if self._tail_len > 0:
            self._tail = (self._tail + delta)[-self._tail_len :]
        return delta


class StopStringChecker:
    """Scheduler-side stop-string detection for one request.

    Feed the ids generated each step to `check`; it returns the matched stop string once the
    decoded output contains one (and keeps returning it). Only a text tail of
    `len(longest stop) - 1` characters plus the newly decoded text is searched: any occurrence that
    completes now must start inside that span, and earlier occurrences were reported earlier. The
    new text is searched even when it ends in an incomplete character, so the answer always agrees
    with `any(s in tokenizer.decode(all_ids))`.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: Sequence[str],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop_regex: Sequence[str] = (),
    ) -> None:
        self.stops: tuple[str, ...] = tuple(s for s in (stop or ()) if s)
        self.regexes = StopRegexes.compile(stop_regex)
        self._decoder = WindowDecoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self._tail_len = max(max((len(s) for s in self.stops), default=1) - 1,
                             self.regexes.window if self.regexes else 0)
        self._tail = ""
        self.matched: str | None = None

    def skip(self, ids: Sequence[int]) -> None:
        """Take ids whose text cannot end a match (the first min_new_tokens - 1 of the output):
        a stop string they contain is not one; one that starts in them and ends later is."""
        self._decoder.append(ids)
        pending = self._decoder.pending()
        if self._decoder.is_stable(pending):
            self._decoder.commit()
            if self._tail_len > 0:
                self._tail = (self._tail + pending)[-self._tail_len :]

    def check(self, new_ids: Sequence[int]) -> str | None:
        if self.matched is not None or not (self.stops or self.regexes):
            return self.matched
        self._decoder.append(new_ids)
        pending = self._decoder.pending()
        if not pending:
            return None
        # Only matches that end in the new text: the tail's were reported (or skipped) before.
        hit = find_stop(self._tail + pending, self.stops, self.regexes,
                        end_after=len(self._tail))
        if hit is not None:
            self.matched = hit[1]
            return self.matched
        if self._decoder.is_stable(pending):
            self._decoder.commit()
            if self._tail_len > 0:
                self._tail = (self._tail + pending)[-self._tail_len :]
        return None
