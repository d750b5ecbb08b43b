"""utils/json_schema_check.py: JSON Schema keywords the grammar backend would drop are found
wherever they sit, and each one listed is really dropped by xgrammar (so the list shrinks when
xgrammar learns one)."""

from __future__ import annotations

import json

import pytest

from radixlm.utils.json_schema_check import unenforced_keyword

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


@pytest.mark.parametrize("schema, where", [
    ({"type": "integer", "not": {"const": 1}}, "`not` (negation) at /"),
    ({**OBJ, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "`if`"),
    ({**OBJ, "dependentRequired": {"a": ["b"]}}, "`dependentRequired` at /"),
    ({"type": "array", "uniqueItems": True}, "`uniqueItems` at /"),
    ({"type": "array", "contains": {"const": 1}}, "`contains` at /"),
    ({"allOf": [OBJ, {"required": ["a"]}]}, "`allOf` with 2 branches at /"),
    ({"$ref": "http://example.com/x.json"}, "another document"),
    # nested: under properties, items, anyOf, $defs
    ({"type": "object", "properties": {"l": {"type": "array", "uniqueItems": True}}},
     "at /properties/l"),
    ({"type": "array", "items": {"not": {"type": "null"}}}, "at /items"),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "not": {"const": ""}}]},
     "at /anyOf/1"),
    ({"$defs": {"x/y": {"if": {"type": "integer"}}}, "$ref": "#/$defs/x~1y"},
     "at /$defs/x~1y"),
    # xgrammar enforces multipleOf on integers only, and drops length bounds beside a pattern
    ({"type": "number", "multipleOf": 7}, "`multipleOf` on a non-integer at /"),
    ({"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"}, "`pattern` with"),
])
def test_unenforced_keywords_are_found(schema, where):
    problem = unenforced_keyword(schema)
    assert problem is not None and where in problem, problem


@pytest.mark.parametrize("schema", [
    OBJ, {"type": "array", "uniqueItems": False, "items": {"type": "integer"}},
    {"allOf": [OBJ]}, {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
    # property names are not keywords
    {"type": "object", "properties": {"not": {"type": "integer"}, "if": {"type": "string"}}},
    {"type": "string", "format": "email"}, {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    {"type": "integer", "multipleOf": 7}, {"type": "string", "maxLength": 3},
    {"type": "string", "pattern": "^[a-z]+$"},
    True, {},
])
def test_enforced_schemas_pass(schema):
    assert unenforced_keyword(schema) is None


def test_each_refused_keyword_is_really_dropped_by_the_backend():
    """xgrammar's grammar for each refused keyword accepts a value the keyword forbids."""
    xgr = pytest.importorskip("xgrammar")
    testing = pytest.importorskip("xgrammar.testing")
    accepts = testing._is_grammar_accept_string
    cases = [({"type": "integer", "not": {"const": 1}}, 1),
             ({**OBJ, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
              {"a": 1}),
             ({**OBJ, "dependentRequired": {"a": ["b"]}}, {"a": 1}),
             ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
             ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}, [2]),
             ({"allOf": [{**OBJ, "required": ["a"]}, {**OBJ, "required": ["b"]}]}, {"a": 1})]
    for schema, violating in cases:
        assert unenforced_keyword(schema) is not None
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        assert accepts(grammar, json.dumps(violating)), (schema, "now enforced: allow it")
