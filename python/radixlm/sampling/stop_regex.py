"""`stop_regex` (SGLang's sampling parameter): the request stops once its output text matches
one of these regular expressions, and the text is cut where the match starts (kept with
`no_stop_trim`), exactly like a stop string whose spelling is a pattern.

Both sides of a stop use this module: the scheduler's StopStringChecker (does the output now
match? then the request finishes on this step) and the detokenizer (where does the text end,
and how much of it must be held back while streaming because a match may be starting).

Patterns are compiled with the `regex` package (Python `re` syntax, plus partial matching):
a partial match that reaches the end of the text is a match that later text may complete, so
the streamer holds back from where it starts, as it holds back a stop string's prefix.

A match spans at most `window` characters of text: the pattern's own bound, or
MAX_WINDOW_CHARS for an unbounded one (`\\d+\\.`), so each step searches a bounded tail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import regex

# The most text an unbounded pattern is matched against (its tail of the output).
MAX_WINDOW_CHARS = 4096


def stop_regex_error(pattern: object) -> str | None:
    """Why `pattern` cannot be a stop_regex (None when it can)."""
    if not isinstance(pattern, str) or not pattern:
        return "must be a non-empty string"
    try:
        compiled = regex.compile(pattern)
    except regex.error as e:
        return f"is not a valid regular expression ({e})"
    if compiled.fullmatch(""):
        return "matches the empty string, so it would stop every request at once"
    return None


def _max_width(pattern: str) -> int:
    """Characters a match of `pattern` spans at most (capped), from Python's own parser."""
    try:
        from re import _parser   # (3.11+: the parser `re` compiles with; sre_parse before)
    except ImportError:          # pragma: no cover
        import sre_parse as _parser   # type: ignore[no-redef]
    try:
        return min(int(_parser.parse(pattern).getwidth()[1]), MAX_WINDOW_CHARS)
    except (re.error, OverflowError, TypeError, ValueError):
        return MAX_WINDOW_CHARS   # syntax only `regex` knows: assume unbounded


@dataclass(frozen=True)
class StopRegexes:
    patterns: tuple[regex.Pattern, ...]
    window: int          # the longest match, in characters (capped)

    @classmethod
    def compile(cls, sources: Sequence[str] | None) -> "StopRegexes | None":
        """None for no patterns (the common case costs nothing per step)."""
        sources = [s for s in (sources or ()) if s]
        if not sources:
            return None
        return cls(tuple(regex.compile(s) for s in sources),
                   max(_max_width(s) for s in sources))

    def find(self, text: str, end_after: int = 0) -> tuple[int, str] | None:
        """The earliest match in `text` whose last character is at or after `end_after` (a
        zero-width match, a lookahead's: that starts there or later): (start, matched text),
        or None."""
        best: tuple[int, str] | None = None
        for pattern in self.patterns:
            pos = 0
            while (m := pattern.search(text, pos)) is not None and _before(m, end_after):
                pos = m.start() + 1           # a match wholly before end_after is no match
            if m is None:
                continue
            if best is None or m.start() < best[0] or (
                    m.start() == best[0] and len(m.group()) > len(best[1])):
                best = (m.start(), m.group())
        return best

    def hold_len(self, text: str) -> int:
        """How many characters at the end of `text` a match may be starting in: from the
        earliest partial match (one that runs to the end of the text) to the end."""
        hold = 0
        for pattern in self.patterns:
            for m in pattern.finditer(text, partial=True):
                if m.partial:
                    hold = max(hold, len(text) - m.start())
                    break
        return hold


def _before(m: regex.Match, end_after: int) -> bool:
    """Whether match `m` lies wholly before index `end_after` (found, or skipped, earlier)."""
    if m.end() > m.start():
        return m.end() <= end_after
    return m.start() < end_after


__all__ = ["MAX_WINDOW_CHARS", "StopRegexes", "stop_regex_error"]
