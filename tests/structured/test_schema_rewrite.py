"""structured/schema_rewrite.py: each rewrite is sound (whatever the rewritten schema accepts,
the schema as written accepts) and, where the module says exact, accepts the same instances;
the rewritten schemas compile with llguidance, and a constrained answer validates against
the schema as written."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixserve import SamplingParams, StructuredOutputsParams
from radixserve.structured.llguidance_spec import validate_spec
from radixserve.structured.params import StructuredOutputsParams as SO
from radixserve.structured.schema_rewrite import enforceable_schema
from radixserve.structured.strict_schema import strict_schema

D7 = "http://json-schema.org/draft-07/schema#"
OBJ = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                        "c": {"type": "boolean"}}}
OBJECTS = [{}, {"a": "x"}, {"b": 1}, {"a": "x", "b": 1}, {"a": "x", "c": True},
           {"a": "x", "b": 1, "c": False}, {"c": True}, {"b": 2, "c": True}]


def accepts(schema, instance) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(instance)


def check(schema, instances, exact=True):
    rewritten = enforceable_schema(schema)
    for instance in instances:
        before, after = accepts(schema, instance), accepts(rewritten, instance)
        assert before or not after, (instance, "accepted only after the rewrite")
        if exact:
            assert before == after, (instance, before, after)
    validate_spec(SO(json=schema, strict=False).spec())  # compiles as rewritten
    validate_spec(SO(json=schema, strict=True).spec())
    return rewritten


@pytest.mark.parametrize("deps", [
    {"dependencies": {"a": ["b"]}}, {"dependencies": {"a": {"required": ["c"]}}},
    {"dependentRequired": {"a": ["b", "c"]}}, {"dependentSchemas": {"c": {"required": ["b"]}}},
    {"dependencies": {"a": ["b"], "c": {"properties": {"b": {"minimum": 2}}}}},
])
def test_dependencies_are_exact(deps):
    draft = {"$schema": D7} if "dependencies" in deps else {}
    check({**draft, **OBJ, **deps}, OBJECTS)


def test_not_of_everything_is_refused():
    assert enforceable_schema({**OBJ, "not": {}}) is False
    with pytest.raises(ValueError, match="accepts no value"):
        SO(json={**OBJ, "not": {}}).spec()


@pytest.mark.parametrize("negated", [
    {"required": ["a"]}, {"required": ["a", "b"]},
    {"anyOf": [{"required": ["a"]}, {"required": ["c"]}]},
    {"allOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"description": "not both", "required": ["a", "b"]},
])
def test_not_of_presence_is_exact(negated):
    check({**OBJ, "not": negated}, OBJECTS)


def test_not_of_types_is_exact():
    values = [None, True, 1, 1.5, "s", [1], {"a": 1}]
    check({"not": {"type": ["string", "null"]}}, values)
    check({"not": {"type": "number"}}, values)
    assert "not" in enforceable_schema({"not": {"type": "integer"}})  # left to be refused


def test_if_then_else():
    check({**OBJ, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, OBJECTS)
    check({**OBJ, "if": {"required": ["a"]}, "then": {"required": ["b"]},
           "else": {"required": ["c"]}}, OBJECTS)
    narrower = {**OBJ, "if": {"properties": {"a": {"const": "x"}}},
                "then": {"required": ["b"]}}
    check(narrower, OBJECTS, exact=False)
    assert enforceable_schema({**OBJ, "if": {"required": ["a"]}}) == OBJ


def test_unique_items_allows_at_most_one_item_where_it_can():
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    out = check(schema, [[], ["a"], ["a", "b"], ["a", "a"]], exact=False)
    assert out["maxItems"] == 1 and "uniqueItems" not in out
    kept = {**schema, "minItems": 2}
    assert enforceable_schema(kept) == kept  # no grammar form: refused by the compiler


def test_formats():
    out = enforceable_schema({"type": "object", "properties": {
        "e": {"type": "string", "format": "idn-email"},
        "u": {"type": "string", "format": "uri-reference"},
        "c": {"type": "string", "format": "color"},
        "r": {"type": "string", "format": "regex"},
        "d": {"type": "string", "format": "date-time"}}})["properties"]
    assert out["e"]["format"] == "email" and out["u"]["format"] == "uri"
    assert "format" not in out["c"] and out["d"]["format"] == "date-time"
    assert "format" not in out["r"] and out["r"]["pattern"]
    for text in ("abc", "a-b c_9", ""):
        assert accepts(out["r"], text) and accepts({"format": "regex"}, text)


def test_ref_siblings_by_draft():
    defs = {"$defs": {"n": {"type": "integer"}}}
    old = {"$schema": D7, "definitions": {"n": {"type": "integer"}},
           "properties": {"x": {"$ref": "#/definitions/n", "minimum": 5, "description": "d"}}}
    assert enforceable_schema(old)["properties"]["x"] == {"$ref": "#/definitions/n"}
    new = {**defs, "properties": {"x": {"$ref": "#/$defs/n", "minimum": 5, "title": "t"}}}
    x = check(new, [{"x": 1}, {"x": 6}, {"x": "s"}])["properties"]["x"]
    assert x == {"type": "integer", "minimum": 5}  # allOf [$ref, rest], inlined and merged


def test_recursive_schema_with_all_of_and_typed_any_of_compiles():
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"type": "object", "anyOf": [
            {"$ref": "#/$defs/node"}, {"$ref": "#/$defs/leaf"}]}}}},
        "leaf": {"type": "object", "properties": {"v": {"type": "integer"}}}},
        "type": "object", "allOf": [{"properties": {"root": {"$ref": "#/$defs/node"}}}]}
    check(schema, [{}, {"root": {"name": "a", "children": [{"v": 1}]}}, {"root": 1}])


def test_strict_keeps_required_names_of_branches():
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
              "required": ["kind"], "dependencies": {"kind": ["extra"]}}
    closed = strict_schema(enforceable_schema(schema))
    assert "extra" in closed["properties"] and closed["additionalProperties"] is False
    validate_spec(SO(json=schema).spec())


def test_constrained_answer_validates_as_written(embedded_llm):
    schema = {"$schema": D7, "type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "nick": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "uniqueItems": True},
        "home": {"type": "string", "format": "hostname"}},
        "required": ["name", "tags"], "dependencies": {"nick": ["home"]},
        "not": {"required": ["home", "nick", "name", "tags"]}}
    params = SamplingParams(temperature=0, max_tokens=120,
                            structured_outputs=StructuredOutputsParams(json=schema))
    out = embedded_llm.chat([{"role": "user", "content": "Describe a user as JSON."}],
                            params)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    assert accepts(schema, json.loads(out.text)), out.text
