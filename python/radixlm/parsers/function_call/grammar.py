"""The grammar that forces a tool call (tool_choice "required" or a named function): the
format's exact wrapper around {"name": <one of the functions>, <args key>: <arguments>} with the
arguments held to that function's `parameters` JSON schema.

It is built with xgrammar's own JSON-schema conversion and handed to the grammar backend as an
`ebnf` constraint, the backend's ordinary request path. xgrammar is imported only here, so a
server that never forces a call never loads it in the HTTP process.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.utils.grammar_errors import compiler_reason
from radixlm.parsers.function_call.base import ForcedFormat

# A function declared without `parameters` takes none (OpenAI: "omitting parameters defines a
# function with an empty parameter list"): its forced arguments are `{}`.
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def call_schema(functions: list[dict[str, Any]], args_key: str) -> dict[str, Any]:
    """JSON schema of one call to any of `functions` (OpenAI function definitions)."""
    options = []
    for fn in functions:
        options.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]},
                           args_key: fn.get("parameters") or _NO_ARGUMENTS},
            "required": ["name", args_key],
            "additionalProperties": False,
        })
    return options[0] if len(options) == 1 else {"anyOf": options}


def _literal(text: str) -> str:
    """An EBNF string literal (xgrammar reads JSON-style escapes)."""
    return json.dumps(text, ensure_ascii=False)


def forced_call_ebnf(fmt: ForcedFormat, functions: list[dict[str, Any]]) -> str:
    """EBNF for exactly one call in format `fmt`. Raises ValueError when a function's
    parameters are not a schema the grammar backend understands."""
    import xgrammar as xgr

    schema = json.dumps(call_schema(functions, fmt.args_key))
    try:
        # Compact separators, as the backend's json_schema constraints: no free whitespace for
        # a small model to wander into.
        parts = [xgr.Grammar.from_json_schema(schema, any_whitespace=False)]
    except Exception as e:  # xgrammar raises RuntimeError / ValueError with the reason
        raise ValueError(f"the tools' parameters are not a usable JSON schema: "
                         f"{compiler_reason(e)}") from None
    if fmt.prefix:
        parts.insert(0, xgr.Grammar.from_ebnf(f"root ::= {_literal(fmt.prefix)}"))
    if fmt.suffix:
        parts.append(xgr.Grammar.from_ebnf(f"root ::= {_literal(fmt.suffix)}"))
    return str(parts[0] if len(parts) == 1 else xgr.Grammar.concat(*parts))
