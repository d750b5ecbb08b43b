"""The JSON-based tool-call formats, under SGLang's --tool-call-parser names.

- qwen25 (Hermes style):  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, repeated
- llama3:                 <|python_tag|>{"name": "f", "parameters": {...}}; several joined by
                          ";" (the tag is optional when the answer starts with the object)
- mistral:                [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
- json:                   a bare {"name": ..., "arguments": ...} object (no marker); what a
                          forced call is written as when no parser is set or the format cannot
                          be constrained by a grammar
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from radixlm.parsers.function_call.base import (ForcedFormat, PartialCall, Scan,
                                                ToolCallParser, join_content,
                                                partial_marker_len)
from radixlm.parsers.function_call.json_calls import scan_call_object, scan_call_sequence


def _call_json(name: str, arguments: dict[str, Any], args_key: str = "arguments") -> str:
    return json.dumps({"name": name, args_key: arguments}, ensure_ascii=False)


class HermesParser(ToolCallParser):
    """qwen25: each call in its own <tool_call>...</tool_call> block; text around them is
    content."""

    name = "qwen25"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"
    forced = ForcedFormat("<tool_call>\n", "\n</tool_call>", "arguments",
                          between="\n</tool_call>\n<tool_call>\n")

    def scan(self, text: str, final: bool) -> Scan:
        pieces, calls, pos = [], [], 0
        while True:
            start = text.find(self.start_marker, pos)
            if start < 0:
                tail = text[pos:]
                if not final:
                    tail = tail[:len(tail) - partial_marker_len(tail, self.start_marker)]
                pieces.append(tail)
                break
            pieces.append(text[pos:start])
            call, end = self._block(text, start + len(self.start_marker), final)
            if call is not None:
                calls.append(call)
            else:                       # malformed: left as written
                pieces.append(text[start:end])
            if end >= len(text):
                pieces.append("")       # marks the piece before as followed by a call
                break
            pos = end
        return Scan(join_content(pieces, final), calls)

    def _block(self, text: str, body: int, final: bool) -> tuple[PartialCall | None, int]:
        """The call in the block whose JSON starts at or after `body`, and where the block
        ends. The end marker is looked for after the object, not by searching, so that one
        inside a string argument does not cut the call."""
        i = body
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i < len(text) and text[i] == "{":
            obj = scan_call_object(text, i)
            if obj.end is None and not obj.error and not final:
                return obj.call, len(text)          # still being generated
            if obj.end is not None and not obj.error:
                rest = text[obj.end:]
                after = obj.end + len(rest) - len(rest.lstrip())
                if text.startswith(self.end_marker, after):
                    return obj.call, after + len(self.end_marker)
                tail = text[after:]
                if not tail or (not final and self.end_marker.startswith(tail)):
                    return obj.call, len(text)      # end marker arriving, or never written
        elif i >= len(text) and not final:
            return PartialCall(), len(text)         # nothing of the object yet
        close = text.find(self.end_marker, body)
        return None, close + len(self.end_marker) if close >= 0 else len(text)

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{self.start_marker}\n{_call_json(name, arguments)}\n{self.end_marker}"


class _TailRegionParser(ToolCallParser):
    """Formats where the calls run from a marker to the end of the output."""

    separators = ""

    def region_start(self, text: str, final: bool) -> tuple[int, int] | None:
        """(region start, body start), or None if no call region has begun. Sets
        self._hold to the characters to hold back when there is none yet."""
        start = text.find(self.start_marker)
        if start < 0:
            return None
        return start, start + len(self.start_marker)

    def scan(self, text: str, final: bool) -> Scan:
        region = self.region_start(text, final)
        if region is None:
            content = text
            if not final:
                content = content[:len(content) - self.hold_back(content)]
            return Scan(join_content([content], final), [])
        start, body_start = region
        calls, ok = scan_call_sequence(text[body_start:], self.separators)
        if not ok or (final and (not calls or not all(c.complete for c in calls))):
            # Not calls after all (text after them, or a malformed one): content, as written.
            # A malformed region stays malformed as the text grows, so this holds while
            # streaming too.
            return Scan(join_content([text], final), [])
        if not final:
            # The region runs to the end of the output: text after a call would make it all
            # content, so no call is complete until the output is (a stream then sends the
            # calls at its end, and never a call that the whole answer turns into content).
            calls = [dataclasses.replace(c, complete=False) for c in calls]
        # The empty second piece marks the first as followed by a call region.
        return Scan(join_content([text[:start], ""], final), calls)

    def hold_back(self, content: str) -> int:
        return partial_marker_len(content, self.start_marker)


class Llama3Parser(_TailRegionParser):
    name = "llama3"
    start_marker = "<|python_tag|>"
    separators = ";"
    forced = ForcedFormat("", "", "parameters", between="; ")

    def region_start(self, text: str, final: bool) -> tuple[int, int] | None:
        found = super().region_start(text, final)
        if found is not None:
            return found
        # Llama 3.1+ also calls tools with a bare JSON object as the whole answer.
        stripped = text.lstrip()
        if stripped.startswith("{"):
            start = len(text) - len(stripped)
            return start, start
        return None

    def hold_back(self, content: str) -> int:
        if not content.strip():
            return len(content)   # the answer may still open with a call object
        return super().hold_back(content)

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return self.start_marker + _call_json(name, arguments, "parameters")


class MistralParser(_TailRegionParser):
    name = "mistral"
    start_marker = "[TOOL_CALLS]"
    separators = "[],"
    forced = ForcedFormat("[TOOL_CALLS] [", "]", "arguments", between=", ")

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{self.start_marker} [{_call_json(name, arguments)}]"


class JsonParser(_TailRegionParser):
    """A bare call object (or several, comma-separated in a list) as the whole answer."""

    name = "json"
    start_marker = ""
    separators = "[],;"
    forced = ForcedFormat("", "", "arguments")

    def region_start(self, text: str, final: bool) -> tuple[int, int] | None:
        stripped = text.lstrip()
        if stripped[:1] in ("{", "["):
            start = len(text) - len(stripped)
            return start, start
        return None

    def hold_back(self, content: str) -> int:
        return len(content) if not content.strip() else 0

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return _call_json(name, arguments)
