"""Work around xgrammar's regex converter reading an escaped caret that opens a character class
as negation.

xgrammar (0.2.8/0.2.9) turns the regex class `[\\^a-z]` ("a caret or a lowercase letter") into the
EBNF class `[^a-z]` ("anything but a lowercase letter"), and `[\\^]` into `[^]`: the escape is
dropped and the caret lands first, where EBNF reads it as negation. The same caret anywhere else in
the class, or after a real negation (`[^\\^a]`), converts correctly, and JSON-schema `pattern`s go
through a different path that is not affected. So before a regex is compiled, every class that
opens with a literal caret is rewritten as an alternation with the caret outside it:
`[\\^a-z]` -> `(?:\\^|[a-z])`, `[\\^]` -> `\\^`, `[\\^-a]` (the range ^.._ `a) -> `(?:\\^|[_-a])`.
The language is unchanged; only the spelling xgrammar sees.
"""
from __future__ import annotations

_CARETS = ("\\^", "^")   # an escaped caret, or a bare one once the class is already open


def protect_leading_caret(regex: str) -> str:
    out: list[str] = []
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if c != "[":
            out.append(c)
            i += 1
            continue
        end = _class_end(regex, i)
        if end is None:             # unbalanced: leave it for xgrammar to report
            out.append(regex[i:])
            break
        out.append(_rewrite_class(regex[i + 1:end]))
        i = end + 1
    return "".join(out)


def _class_end(regex: str, start: int) -> int | None:
    """Index of the `]` closing the class opened at `start` (a `]` first in the class, or
    escaped, is a member)."""
    i = start + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1
    while i < len(regex):
        if regex[i] == "\\":
            i += 2
            continue
        if regex[i] == "]":
            return i
        i += 1
    return None


def _rewrite_class(body: str) -> str:
    """`body` is the text between the brackets; returns the class, rewritten if it opens with an
    escaped caret."""
    if not body.startswith("\\^"):
        return f"[{body}]"
    rest = body
    has_range_to: str | None = None
    while True:                     # drop every leading caret (`[\^\^a]`, `[\^^a]`)
        for caret in _CARETS:
            if rest.startswith(caret):
                rest = rest[len(caret):]
                break
        else:
            break
        if rest.startswith("-") and len(rest) > 1 and rest[1] != "]":
            upper, width = _member(rest, 1)
            if upper is None or upper < "^":   # an escape we do not decode, or an empty range:
                return f"[{body}]"              # leave it to xgrammar as written
            has_range_to = max(has_range_to or upper, upper)
            rest = rest[1 + width:]
    if has_range_to is not None and has_range_to > "^":
        rest = f"_-{_escape(has_range_to)}{rest}" if has_range_to > "_" else f"_{rest}"
    if not rest:
        return "\\^"
    return f"(?:\\^|[{rest}])"


def _member(text: str, at: int) -> tuple[str | None, int]:
    """The character at `text[at]` (a literal or a single escaped punctuation mark) and the
    width of its spelling; None for escapes such as `\\x41` or `\\d`."""
    if text[at] != "\\":
        return text[at], 1
    if at + 1 < len(text) and not text[at + 1].isalnum():
        return text[at + 1], 2
    return None, 0


def _escape(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch
