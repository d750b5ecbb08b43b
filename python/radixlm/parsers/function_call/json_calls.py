"""Incremental reading of JSON call objects, {"name": "f", "arguments": {...}}, as they are
generated: the name once its string is closed, the arguments' text as far as it goes.

Only the structure is walked here (strings, nesting); values are decoded with `json` once they
are complete. The arguments are reported as the model wrote them (a prefix while streaming),
so the streamed pieces join to exactly the text of the finished call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from radixlm.parsers.function_call.base import PartialCall, arguments_object

NAME_KEYS = ("name",)
ARGS_KEYS = ("arguments", "parameters")
_WS = " \t\r\n"


def string_end(text: str, i: int) -> int | None:
    """text[i] is '"': the index after the closing quote, or None if the string is open."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at text[i], or None if it is not finished.
    Scalars end at a delimiter, so one at the very end of the text counts as unfinished."""
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    while i < len(text) and text[i] not in ",}]" + _WS:
        i += 1
    return i if i < len(text) else None


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


@dataclass
class ObjectScan:
    call: PartialCall
    end: int | None     # index after the closing brace; None while the object is open
    error: bool         # not a call object (bad syntax, wrong value types)


def scan_call_object(text: str, start: int) -> ObjectScan:
    """Read the call object that starts at text[start] == '{'."""
    call = PartialCall()
    args_raw: str | None = None        # the complete arguments value as written
    i = start + 1
    fail = ObjectScan(call, None, True)
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            break
        if text[i] == "}":
            return _close(call, args_raw, i + 1)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
            if i >= len(text):
                break
        if text[i] != '"':
            return fail
        key_end = string_end(text, i)
        if key_end is None:
            break
        key = json.loads(text[i:key_end])
        i = _skip_ws(text, key_end)
        if i >= len(text):
            break
        if text[i] != ":":
            return fail
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            break
        end = value_end(text, i)
        if key in ARGS_KEYS:
            if end is None:
                # Stream the object's text as it comes; other value kinds only when complete.
                if text[i] == "{":
                    call.arguments = text[i:]
                break
            args_raw = text[i:end]
            if text[i] == "{":
                call.arguments = args_raw
        elif end is None:
            break
        elif key in NAME_KEYS:
            try:
                name = json.loads(text[i:end])
            except json.JSONDecodeError:
                return fail
            if not isinstance(name, str):
                return fail
            call.name = name
        i = end
    return ObjectScan(call, None, False)


def _close(call: PartialCall, args_raw: str | None, end: int) -> ObjectScan:
    if call.name is None:
        return ObjectScan(call, end, True)
    if args_raw is None:
        call.arguments = "{}"
    else:
        try:
            value = json.loads(args_raw)
        except json.JSONDecodeError:
            return ObjectScan(call, end, True)
        if isinstance(value, dict):
            call.arguments = args_raw        # as written: what was streamed
        else:
            normalized = arguments_object(value)
            if normalized is None:
                return ObjectScan(call, end, True)
            call.arguments = normalized
    call.complete = True
    return ObjectScan(call, end, False)


def scan_call_sequence(text: str, separators: str = "") -> tuple[list[PartialCall], bool]:
    """Call objects one after another, separated by whitespace and `separators` characters.
    Returns the calls and whether the text is well-formed so far (False: something other than
    a call object or a separator, or a malformed object)."""
    calls: list[PartialCall] = []
    i = 0
    skip = _WS + separators
    while True:
        while i < len(text) and text[i] in skip:
            i += 1
        if i >= len(text):
            return calls, True
        if text[i] != "{":
            return calls, False
        obj = scan_call_object(text, i)
        if obj.error:
            return calls, False
        calls.append(obj.call)
        if obj.end is None:
            return calls, True
        i = obj.end
