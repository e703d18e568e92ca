"""structured/schema_check.py agrees with the `jsonschema` package on the keywords it checks,
and lets the ones it does not check pass."""

from __future__ import annotations

import jsonschema
import pytest

from radixserve.structured.schema_check import satisfies

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"], "additionalProperties": False}
NESTED = {"type": "object", "$defs": {"point": {"type": "object", "properties": {
    "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}},
    "properties": {"path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1},
                   "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                   "mode": {"const": "fast"},
                   "tags": {"type": "array", "prefixItems": [{"type": "string"}],
                            "items": {"type": "integer"}},
                   "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                   "meta": {"type": "object", "additionalProperties": {"type": "string"},
                            "maxProperties": 2}}}

CASES = [
    (WEATHER, {"city": "Paris"}),
    (WEATHER, {"unit": "celsius", "city": "Paris", "days": 3}),
    (WEATHER, {"city": "Paris", "days": 3.0}),  # an integer, by JSON's rules
    (WEATHER, {"city": "Paris", "days": 2.5}),
    (WEATHER, {"city": "Paris", "days": True}),
    (WEATHER, {"city": "Paris", "days": 8}),
    (WEATHER, {"city": ""}),
    (WEATHER, {"city": "Paris", "unit": "kelvin"}),
    (WEATHER, {"city": "Paris", "wind": True}),
    (WEATHER, {}),
    (WEATHER, ["Paris"]),
    (NESTED, {"path": [{"x": 1, "y": 2.5}]}),
    (NESTED, {"path": []}),
    (NESTED, {"path": [{"x": 1}]}),
    (NESTED, {"label": None, "mode": "fast"}),
    (NESTED, {"label": 3}),
    (NESTED, {"mode": "slow"}),
    (NESTED, {"tags": ["a", 1, 2]}),
    (NESTED, {"tags": ["a", "b"]}),
    (NESTED, {"code": "ABC"}),
    (NESTED, {"code": "ABCD"}),
    (NESTED, {"ratio": 0.5}),
    (NESTED, {"ratio": 1}),
    (NESTED, {"meta": {"a": "x", "b": "y"}}),
    (NESTED, {"meta": {"a": "x", "b": "y", "c": "z"}}),
    (NESTED, {"meta": {"a": 1}}),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "x"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 2),
    ({"not": {"type": "string"}}, "x"),
    ({"type": ["string", "null"]}, None),
    ({"enum": [1, "a"]}, True),  # true is not 1
    ({"const": {"a": [1, 2]}}, {"a": [1.0, 2]}),
    (True, {"any": "thing"}),
    (False, {}),
]


@pytest.mark.parametrize("schema, value", CASES)
def test_agrees_with_jsonschema(schema, value) -> None:
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert satisfies(value, schema) is expected


@pytest.mark.parametrize("schema, value", [
    ({"type": "string", "format": "email"}, "not an email"),  # format: not checked
    ({"type": "string", "pattern": "(?<"}, "x"),  # a pattern Python cannot read
    ({"$ref": "#/$defs/missing"}, 1),  # an unresolvable reference
    ({"type": "no-such-type"}, 1),
    ({"type": "object", "nullable": True}, None),  # OpenAPI's nullable
])
def test_what_it_cannot_read_does_not_refuse(schema, value) -> None:
    assert satisfies(value, schema)
