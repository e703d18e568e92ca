"""Structured output under speculation: drafts are cut to what the grammar accepts, the mask
follows each draft position, the matcher is rolled back: outputs match their schema and, under
greedy, the run without speculation."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_spec_embedded import speculating

from radixserve import SamplingParams, StructuredOutputsParams

SCHEMA = {"type": "array", "minItems": 3, "maxItems": 3, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"], "additionalProperties": False}}
PROMPT = "A JSON list of three people with their name and age: "


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMA),
                          **kw)


@pytest.fixture(scope="module")
def plain(embedded_llm):
    return embedded_llm.generate(PROMPT, _params(temperature=0.0))[0].outputs[0]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_schema_outputs_equal_and_valid(embedded_llm, plain, method):
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    with speculating(embedded_llm, method, []) as s:
        s.check = lambda: s.new.check_integrity()
        greedy = embedded_llm.generate(PROMPT, _params(temperature=0.0))[0].outputs[0]
        sampled = embedded_llm.generate([PROMPT] * 2, [_params(temperature=1.0, seed=3),
                                                       _params(temperature=0.0)])
    assert greedy.token_ids == plain.token_ids
    assert sampled[1].outputs[0].token_ids == plain.token_ids
    jsonschema.validate(json.loads(sampled[0].outputs[0].text), SCHEMA)
    assert s.spec.num_accepted_tokens > 0


def test_draftable_leaves_the_matcher_as_it_was(embedded_llm, plain):
    grammar = embedded_llm.engine.structured.grammar_for(StructuredOutputsParams(json=SCHEMA))
    grammar._compiled.result(timeout=30)
    assert grammar.is_ready and grammar.can_draft
    out = plain.token_ids
    for t in out[:4]:
        assert grammar.accept(t, []) is None
    bad = embedded_llm.get_tokenizer().encode("}}}")
    assert grammar.draftable(out[4:9] + bad) == out[4:9]
    assert grammar.draftable(bad) == []
    # the state is the one of a run without drafts: the rest of the output still fits
    assert grammar.matcher.valid_prefix(out[4:]) == len(out) - 4
