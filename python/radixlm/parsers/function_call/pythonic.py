"""pythonic: calls written as a Python list of calls, [get_weather(city="Paris"), ping()]
(Llama 3.2 / Llama 4 style), optionally wrapped in <|python_start|> ... <|python_end|>.

The list is parsed with Python's own `ast` once it closes, so a call's name and arguments are
sent together (one argument piece per call). A forced call (tool_choice required / named)
cannot be written as a grammar over Python syntax with the arguments' JSON schema, so it falls
back to the plain JSON form (JsonParser).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from radixlm.parsers.function_call.base import (PartialCall, Scan, ToolCallParser,
                                                join_content, partial_marker_len)
from radixlm.parsers.function_call.formats import JsonParser

_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
# A tail that could still grow into a list of calls: "[", "[ get", "[get_weather ", ...
_MAYBE_START = re.compile(r"\[\s*([A-Za-z_][\w.]*\s*)?$")
_WRAPPERS = ("<|python_start|>", "<|python_end|>")


def _list_end(text: str, start: int) -> int | None:
    """Index after the bracket closing the list at text[start], skipping Python strings."""
    depth, i, quote = 0, start, None
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _calls_of(source: str) -> list[PartialCall] | None:
    """The calls of a complete list literal, or None if it is not a list of calls with
    literal keyword arguments."""
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except (ValueError, SyntaxError):
            return None
        if None in args:      # **kwargs
            return None
        calls.append(PartialCall(name, json.dumps(args, ensure_ascii=False), True))
    return calls


class PythonicParser(ToolCallParser):
    name = "pythonic"
    start_marker = "["

    def scan(self, text: str, final: bool) -> Scan:
        for tag in _WRAPPERS:
            text = text.replace(tag, "")
        pieces, calls, pos = [], [], 0
        while True:
            m = _START.search(text, pos)
            if m is None:
                tail = text[pos:]
                if not final:
                    hold = _MAYBE_START.search(tail)
                    if hold is not None:
                        tail = tail[:hold.start()]
                    tail = tail[:len(tail) - max(partial_marker_len(tail, w) for w in _WRAPPERS)]
                pieces.append(tail)
                break
            pieces.append(text[pos:m.start()])
            end = _list_end(text, m.start())
            if end is None:
                if final:
                    pieces.append(text[m.start():])   # never closed: left as written
                break
            found = _calls_of(text[m.start():end])
            if found is None:
                pieces.append(text[m.start():end])
            else:
                calls.extend(found)
            pos = end
        return Scan(join_content(pieces, final), calls)

    def forced_parser(self) -> ToolCallParser:
        return JsonParser()

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        return f"[{name}({args})]"
