"""The grammar that forces a tool call (tool_choice "required" or a named function): the
format's exact wrapper around {"name": <one of the functions>, <args key>: <arguments>} with the
arguments held to that function's `parameters` JSON schema.

It is built with xgrammar's own JSON-schema conversion and handed to the grammar backend as an
`ebnf` constraint, the backend's ordinary request path. xgrammar is imported only here, so a
server that never forces a call never loads it in the HTTP process.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixlm.utils.json_schema_check import unenforced_keyword
from radixlm.utils.grammar_errors import compiler_reason
from radixlm.parsers.function_call.base import ForcedFormat

# A function declared without `parameters` takes none (OpenAI: "omitting parameters defines a
# function with an empty parameter list"): its forced arguments are `{}`.
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
_CALL_RULE = "radixlm_forced_call"


def _with_refs_under(node: Any, base: str) -> Any:
    """`node` with each local `$ref` ("#...") moved under the JSON pointer `base`."""
    if isinstance(node, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#")
                    else _with_refs_under(v, base)) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_refs_under(v, base) for v in node]
    return node


def _has_ref(node: Any) -> bool:
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for v in node.values())
    return isinstance(node, list) and any(_has_ref(v) for v in node)


def call_schema(functions: list[dict[str, Any]], args_key: str) -> dict[str, Any]:
    """JSON schema of one call to any of `functions` (OpenAI function definitions). The
    parameters sit inside the call's object, so a schema with local references ("#/$defs/X",
    as pydantic writes them) goes whole under the root's $defs and its references are moved
    with it: they resolve against the parameters, not the wrapper."""
    options, defs = [], {}
    for i, fn in enumerate(functions):
        params = fn.get("parameters") or _NO_ARGUMENTS
        if _has_ref(params):
            key = f"radixlm_arguments_of_{'abcdefghijklmnopqrstuvwxyz'[i % 26]}{i // 26 or ''}"
            defs[key] = _with_refs_under(params, f"#/$defs/{key}")
            params = {"$ref": f"#/$defs/{key}"}
        options.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, args_key: params},
            "required": ["name", args_key],
            "additionalProperties": False,
        })
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "$defs": defs} if defs else schema


def _literal(text: str) -> str:
    """An EBNF string literal (xgrammar reads JSON-style escapes)."""
    return json.dumps(text, ensure_ascii=False)


def forced_call_ebnf(fmt: ForcedFormat, functions: list[dict[str, Any]],
                     several: bool = False) -> str:
    """EBNF for exactly one call in format `fmt`, or with `several` one or more calls joined
    by the format's separator. Raises ValueError when a function's parameters are not a
    schema the grammar backend understands."""
    import xgrammar as xgr

    for fn in functions:
        problem = unenforced_keyword(fn.get("parameters"))
        if problem:
            raise ValueError(f"the parameters of tool {fn.get('name')!r} use {problem}, which "
                             f"the grammar cannot enforce (the call could break the schema)")
    schema = json.dumps(call_schema(functions, fmt.args_key))
    try:
        # Compact separators, as the backend's json_schema constraints: no free whitespace for
        # a small model to wander into.
        call = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    except Exception as e:  # xgrammar raises RuntimeError / ValueError with the reason
        raise ValueError(f"the tools' parameters are not a usable JSON schema: "
                         f"{compiler_reason(e)}") from None
    # The schema's grammar becomes rule _CALL_RULE (no other rule refers to its root: the
    # conversion names the rest root_prop_0, basic_string, ...), and a new root wraps it.
    call = re.sub(r"^root ::=", f"{_CALL_RULE} ::=", call, count=1, flags=re.MULTILINE)
    body = _CALL_RULE
    if several:
        body = f"{_CALL_RULE} ({_literal(fmt.between)} {_CALL_RULE})*"
    parts = [_literal(p) for p in (fmt.prefix,) if p] + [body] + \
        [_literal(s) for s in (fmt.suffix,) if s]
    return f"root ::= {' '.join(parts)}\n{call}"
