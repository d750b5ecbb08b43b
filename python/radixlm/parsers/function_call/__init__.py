"""Tool-call parsers by their --tool-call-parser name (SGLang's names)."""

from __future__ import annotations

from radixlm.parsers.function_call.base import (ForcedFormat, PartialCall, Scan,
                                                ToolCallParser)
from radixlm.parsers.function_call.formats import (HermesParser, JsonParser, Llama3Parser,
                                                   MistralParser)
from radixlm.parsers.function_call.pythonic import PythonicParser

TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "qwen25": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}


def get_tool_call_parser(name: str) -> ToolCallParser:
    return TOOL_CALL_PARSERS[name]()


__all__ = ["ForcedFormat", "JsonParser", "PartialCall", "Scan", "ToolCallParser",
           "TOOL_CALL_PARSERS", "get_tool_call_parser"]
