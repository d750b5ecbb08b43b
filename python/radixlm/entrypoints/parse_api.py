"""SGLang's native parsing endpoints, for clients that call /generate and parse the text
themselves (no model involved):

- POST /parse_function_call {"text", "tool_call_parser", "tools"} ->
  {"normal_text", "calls": [{"tool_index", "name", "parameters"}]}: the calls the parser reads
  in the text (parameters: their arguments as JSON text; tool_index: the tool's position in
  `tools`), calls to a function that is not in `tools` left out, as SGLang does;
- POST /separate_reasoning {"text", "reasoning_parser"} -> {"text", "reasoning_text"}.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from radixlm.entrypoints.errors import bad_request
from radixlm.entrypoints.request_body import read_json_body
from radixlm.parsers.function_call import TOOL_CALL_PARSERS, get_tool_call_parser
from radixlm.parsers.reasoning import REASONING_PARSERS, get_reasoning_parser

router = APIRouter()


def _field(body: Any, name: str, kind: type, what: str) -> Any:
    value = body.get(name) if isinstance(body, dict) else None
    if not isinstance(value, kind):
        raise ValueError(f"`{name}` must be {what}")
    return value


def _parser_name(body: Any, name: str, known: dict) -> str:
    value = _field(body, name, str, f"one of {sorted(known)}")
    if value not in known:
        raise ValueError(f"`{name}` must be one of {sorted(known)}, got {value!r}")
    return value


def _tool_names(tools: list) -> list[str]:
    names = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError("each of `tools` must be {\"type\": \"function\", \"function\": "
                             "{\"name\": ..., ...}}")
        names.append(fn["name"])
    return names


@router.post("/parse_function_call")
async def parse_function_call(request: Request):
    try:
        body = await read_json_body(request)
        text = _field(body, "text", str, "a string")
        parser = get_tool_call_parser(_parser_name(body, "tool_call_parser", TOOL_CALL_PARSERS))
        names = _tool_names(_field(body, "tools", list, "a list of tools"))
    except ValueError as e:
        return bad_request(e)
    scan = parser.parse(text)
    calls = [{"tool_index": names.index(c.name), "name": c.name, "parameters": c.arguments}
             for c in scan.calls if c.complete and c.name in names]
    return {"normal_text": scan.content, "calls": calls}


@router.post("/separate_reasoning")
async def separate_reasoning(request: Request):
    try:
        body = await read_json_body(request)
        text = _field(body, "text", str, "a string")
        parser = get_reasoning_parser(_parser_name(body, "reasoning_parser", REASONING_PARSERS))
    except ValueError as e:
        return bad_request(e)
    split = parser.split(text, parser.starts_in_reasoning, final=True)
    return {"text": split.content, "reasoning_text": split.reasoning}
