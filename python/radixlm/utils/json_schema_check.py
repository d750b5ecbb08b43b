"""JSON Schema keywords the grammar backend would drop without a word.

xgrammar turns a JSON schema into a grammar, and some keywords do not survive: the grammar
accepts values they forbid (checked against xgrammar 0.2.8-0.2.9 by asking its grammar whether
it accepts a violating value). A request that relies on one of them would get 200 and output
that breaks its own schema, so such schemas are refused (400) instead, as OpenAI's strict mode
refuses keywords it does not support. `format` is left alone: JSON Schema makes it an
annotation unless a validator opts in, and the formats the backend knows (date, email, uuid,
...) are enforced.
"""

from __future__ import annotations

from typing import Any, Iterator

# keyword -> why it cannot be enforced (for the error message)
UNENFORCED = {
    "not": "`not` (negation)",
    "if": "`if` / `then` / `else` (conditions)",
    "then": "`if` / `then` / `else` (conditions)",
    "else": "`if` / `then` / `else` (conditions)",
    "dependentRequired": "`dependentRequired`",
    "dependentSchemas": "`dependentSchemas`",
    "dependencies": "`dependencies`",
    "contains": "`contains`",
    "uniqueItems": "`uniqueItems`",
}

# Keywords whose value is one subschema, a list of them, or a name -> subschema map
_ONE = ("items", "additionalProperties", "additionalItems", "unevaluatedProperties",
        "unevaluatedItems", "propertyNames", "contains", "not", "if", "then", "else")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def unenforced_keyword(schema: Any) -> str | None:
    """A description of the first keyword in `schema` the grammar would not enforce, with
    where it is (a JSON pointer), or None when every keyword is enforced."""
    for pointer, node in _subschemas(schema, ""):
        for key, what in UNENFORCED.items():
            if key not in node:
                continue
            if key == "uniqueItems" and node[key] is not True:
                continue
            return f"{what} at {pointer or '/'}"
        if "multipleOf" in node and node.get("type") not in ("integer", ["integer"]):
            # (xgrammar enforces it on integers only: 4 passed multipleOf 7 as a number)
            return f"`multipleOf` on a non-integer at {pointer or '/'}"
        if "pattern" in node and ("minLength" in node or "maxLength" in node):
            # (the length bounds are dropped beside a pattern)
            return f"`pattern` with `minLength` / `maxLength` at {pointer or '/'}"
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            return f"`allOf` with {len(node['allOf'])} branches at {pointer or '/'}"
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return f"a `$ref` to another document ({ref}) at {pointer or '/'}"
    return None


def _subschemas(node: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `node` (itself first) with its JSON pointer. Names under
    `properties` are property names, not keywords: only their values are schemas."""
    if not isinstance(node, dict):
        return
    yield pointer, node
    for key in _ONE:
        if isinstance(node.get(key), dict):
            yield from _subschemas(node[key], f"{pointer}/{key}")
    for key in _LIST:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _subschemas(sub, f"{pointer}/{key}/{i}")
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _subschemas(sub, f"{pointer}/{key}/{_escape(str(name))}")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
