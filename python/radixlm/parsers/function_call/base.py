"""What every tool-call format shares: the parse result, the parser interface, and the helpers
for holding back text that may still turn into a marker.

Parsers are pure functions of the text generated so far (`scan(text, final)`), not stateful
stream consumers: streaming re-scans the cumulative text and sends the difference. That keeps
one code path for whole and streamed responses, so a streamed answer accumulates to exactly the
non-streamed one. The price is O(length^2) scanning over a stream, negligible next to decoding.

A scan must be *monotone*: for a text t and any extension t + s, the content and each call's
arguments from scan(t, final=False) are prefixes of those from scan(t + s, ...) (except where
the whole output turns out malformed at the end, which then goes to `content`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PartialCall:
    """One tool call as far as it has been generated."""
    name: str | None = None   # set once the whole name has been generated
    arguments: str = ""       # JSON text of the arguments so far (a prefix of the final one)
    complete: bool = False    # the call's text is closed and well-formed


@dataclass
class Scan:
    content: str = ""                                       # text that is not a tool call
    calls: list[PartialCall] = field(default_factory=list)


@dataclass(frozen=True)
class ForcedFormat:
    """The exact text of a forced answer: prefix + {"name": ..., ARGS_KEY: {...}} + suffix,
    and with several calls (tool_choice "required" with parallel calls allowed) the calls
    joined by `between`. tool_choice required / named constrains the output to it (see
    grammar.py)."""
    prefix: str
    suffix: str
    args_key: str
    between: str = "\n"


class ToolCallParser(ABC):
    """One model family's tool-call format."""

    name: str = ""
    # The text that starts a call region. Where the tokenizer has it as a special token, the
    # request keeps special tokens in its output text, or the marker would be lost.
    start_marker: str = ""
    forced: ForcedFormat = ForcedFormat("", "", "arguments")

    @abstractmethod
    def scan(self, text: str, final: bool) -> Scan:
        """Split generated text into content and calls. final=False: the text may grow, so hold
        back what could still become a marker and report unclosed calls as they stand.
        final=True: a call region that is not well-formed goes to content as written."""

    def parse(self, text: str) -> Scan:
        return self.scan(text, final=True)

    def forced_parser(self) -> "ToolCallParser":
        """The parser that reads this format's forced output (itself, unless the format cannot
        be constrained by a grammar and falls back to plain JSON calls)."""
        return self

    @abstractmethod
    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        """A call as this model family writes it: for assistant history messages, and for the
        example in the tool prompt, when the chat template cannot render tools."""

    def tool_prompt(self, tools: list[dict[str, Any]]) -> str:
        """A system prompt that describes the tools and how to call them in this format, for
        chat templates that ignore `tools`."""
        lines = [json.dumps(t, ensure_ascii=False) for t in tools]
        example = self.render_call("function_name", {"argument": "value"})
        return ("You can call the following functions. Each is described by a JSON object:\n"
                + "\n".join(lines)
                + "\n\nTo call a function, answer with exactly this form (arguments as a JSON "
                  "object that follows the function's parameter schema):\n"
                + example
                + "\nIf no function fits, answer the user directly.")


# ---------------------------------------------------------------------------- helpers

def partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with: characters that
    must be held back while streaming because the marker may be arriving."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def join_content(pieces: list[str], final: bool) -> str:
    """Join the text pieces around call regions. Whitespace that only separates content from a
    call (or calls from each other) is dropped, but content on both sides of a call keeps one
    separator, the whitespace written before the call (else after it): "Hi there <call> bye"
    gives "Hi there bye". The last piece keeps trailing whitespace back until the end, because
    a call may still follow it. Both rules are monotone: what is held back is only ever added,
    never taken back."""
    out: list[str] = []
    gap = ""        # whitespace between the content so far and the call region after it
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        lead = ""
        if i > 0:                       # after a call region
            body = piece.lstrip()
            lead, piece = piece[:len(piece) - len(body)], body
        trail = ""
        if i < last or not final:       # before a call region, or maybe before one
            body = piece.rstrip()
            trail, piece = piece[len(body):], body
        if piece:
            if out:
                out.append(gap or lead)
            out.append(piece)
            gap = trail
    return "".join(out)


def arguments_object(value: Any) -> str | None:
    """The arguments value of a call as a JSON object text, or None if it is not an object.
    Some models write the arguments as a string holding JSON; that is accepted too."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)
