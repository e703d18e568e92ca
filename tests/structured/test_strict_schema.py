"""Strict JSON schemas: which objects are closed, the whitespace llguidance then allows, and
how a request's ``strict`` and the server's ``--structured-strict`` combine."""

from __future__ import annotations

import asyncio
import json

import llguidance
import pytest

from radixserve.tokenizer.tokenizer import load_tokenizer
from radixserve.models.source import ModelSource
from radixserve.sampling_params import SamplingParams
from radixserve.frontend.openai.protocol_structured import ResponseFormat, structured_params
from radixserve.frontend.openai.serving import ServingContext
from radixserve.structured.llguidance_spec import grammar_text
from radixserve.structured.params import StructuredOutputsParams as SO
from radixserve.structured.strict_schema import STRICT_JSON_OPTIONS, strict_schema
from radixserve.structured.validator import GrammarValidator

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_objects_with_properties_are_closed_recursively():
    schema = {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"x": {"type": "string"}}},
        "list": {"type": "array", "items": OBJ},
        "either": {"anyOf": [OBJ, {"type": "null"}]},
        "free": {"type": "object"},
        "open": {**OBJ, "additionalProperties": True},
        "typed": {**OBJ, "additionalProperties": {"type": "string"}}},
        "$defs": {"d": OBJ}}
    before = json.dumps(schema)
    out = strict_schema(schema)
    assert json.dumps(schema) == before  # not mutated
    p = out["properties"]
    assert out["additionalProperties"] is False
    assert p["inner"]["additionalProperties"] is False
    assert p["list"]["items"]["additionalProperties"] is False
    assert p["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in p["free"]  # free-form: closing it leaves only {}
    assert p["open"]["additionalProperties"] is True
    assert p["typed"]["additionalProperties"] == {"type": "string"}
    assert out["$defs"]["d"]["additionalProperties"] is False
    assert out["x-guidance"] == STRICT_JSON_OPTIONS


def test_all_of_branches_stay_open_and_own_options_win():
    schema = {"allOf": [OBJ, {"type": "object", "properties": {"b": OBJ}}],
              "x-guidance": {"key_separator": ":"}}
    out = strict_schema(schema)
    assert all("additionalProperties" not in branch for branch in out["allOf"])
    assert out["allOf"][1]["properties"]["b"]["additionalProperties"] is False
    assert out["x-guidance"]["key_separator"] == ":"
    assert out["x-guidance"]["item_separator"] == ", "


@pytest.fixture(scope="module")
def lltok():
    tok = load_tokenizer(ModelSource.resolve(None))
    return llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                                  eos_token=sorted(tok.eos_token_ids))


@pytest.mark.parametrize("text, strict_ok, loose_ok", [
    ('{"a": 1, "b": [{"c": "x"}]}', True, True),
    ('{"a":1}', False, True),  # strict whitespace is the one canonical form
    ('{ "a": 1 }', False, True),
    ('{"a": 1, "z": 2}', False, True),  # an extra key
    ('{"a": 1, "b": [{"c": "x", "d": 1}]}', False, True),  # an extra key, nested
])
def test_strict_grammar_accepts_only_closed_canonical_json(lltok, text, strict_ok, loose_ok):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {
        "type": "array", "items": {"type": "object", "properties": {"c": {"type": "string"}}}}},
        "required": ["a"]}
    for strict, expected in ((True, strict_ok), (None, strict_ok), (False, loose_ok)):
        m = llguidance.LLMatcher(lltok, grammar_text(SO(json=schema, strict=strict).spec()),
                                 log_level=0)
        assert (m.consume_tokens(lltok.tokenize_str(text)) and m.is_accepting()) == expected


def test_json_object_stays_any_object():
    assert SO(json_object=True).spec() == SO(json_object=True, strict=True).spec()
    assert "additionalProperties" not in SO(json_object=True).spec().text


@pytest.mark.parametrize("request_strict, server_strict, expected", [
    (None, True, True), (None, False, False), (True, False, True), (False, True, False)])
def test_request_strict_wins_over_the_server_default(request_strict, server_strict, expected):
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {
        "name": "x", "schema": OBJ, **({} if request_strict is None
                                       else {"strict": request_strict})}})
    params = SamplingParams(structured_outputs=structured_params(fmt, None))
    checked = []
    ctx = ServingContext(engine=None, model_name="m",
                         grammar_validator=GrammarValidator(checked.append),
                         structured_strict=server_strict)
    asyncio.run(ctx.check_structured("response_format", [params]))
    assert params.structured_outputs.strict is expected
    assert checked == [SO(json=OBJ, strict=expected).spec()]


def test_strict_must_be_a_boolean():
    with pytest.raises(ValueError, match="strict"):
        SO(json=OBJ, strict="yes")
