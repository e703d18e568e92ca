"""The wind-down rule (structured/wind_down.py): in the last tokens of its budget a JSON answer
is narrowed to close; before that the output is untouched, and the answer that would have been
cut at max_tokens now finishes as valid JSON."""

from __future__ import annotations

import json

import pytest
import torch

from radixserve import SamplingParams, StructuredOutputsParams
from radixserve.structured.params import StructuredOutputsParams as SO
from radixserve.structured.wind_down import NO_WIND_DOWN, WindDown

TOKENS = [b"abc", b'"', b"]", b" }", b",", b'", "', b"1", None, b'"]}', b"x,"]


def row(*allowed: int) -> torch.Tensor:
    bits = torch.zeros(32, dtype=torch.int64)
    for t in allowed:
        bits[t] = 1
    word = int((bits << torch.arange(32)).sum())
    return torch.tensor([word - 2**32 if word >= 2**31 else word], dtype=torch.int32)


def allowed(r: torch.Tensor) -> set[int]:
    word = int(r[0]) & 0xFFFFFFFF
    return {t for t in range(32) if word >> t & 1}


def test_narrow_prefers_closing_then_structural_else_leaves_the_row():
    wd = WindDown(lambda: TOKENS, len(TOKENS), fill=None)
    r = row(0, 1, 2, 4, 6)
    wd.narrow(r)
    assert allowed(r) == {1, 2}  # '"' and ']': close
    r = row(0, 4, 5, 6)
    wd.narrow(r)
    assert allowed(r) == {4, 5}  # ',' and '", "': move on
    r = row(0, 6, 9)
    wd.narrow(r)
    assert allowed(r) == {0, 6, 9}  # nothing closes: as the grammar has it
    r = row(3, 7, 8)
    wd.narrow(r)
    assert allowed(r) == {3, 8}  # whitespace aside; special tokens never


def test_closing_cost_walks_the_grammar_and_rolls_back(embedded_llm):
    manager = embedded_llm.engine.structured
    tokenizer = embedded_llm.get_tokenizer()
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "integer"}}, "b": {"type": "string"}}, "required": ["a", "b"]}
    matcher = manager.backend.compile(SO(json=schema).spec()).new_matcher()
    prefix = tokenizer.encode('{"a": [1, 2', add_special_tokens=False)
    for token in prefix:
        assert matcher.accept_token(token)
    cost = manager.wind_down.closing_cost(matcher)
    # '], "b": ""}' at the least: a few tokens, and the matcher is where it was
    assert 3 <= cost <= 12
    assert matcher.accept_token(tokenizer.encode(", 3", add_special_tokens=False)[0])


ARRAY = {"type": "object", "properties": {"numbers": {"type": "array",
                                                      "items": {"type": "integer"}}},
         "required": ["numbers"]}


@pytest.mark.parametrize("max_tokens", [30, 60])
def test_an_endless_array_closes_in_its_budget(embedded_llm, max_tokens):
    manager = embedded_llm.engine.structured
    params = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=(
        StructuredOutputsParams(json=ARRAY)))
    prompt = [{"role": "user", "content": "Count from 1 to 1000 in JSON."}]
    wound = embedded_llm.chat(prompt, params)[0].outputs[0]
    saved = manager.wind_down
    manager.wind_down = NO_WIND_DOWN
    try:
        free = embedded_llm.chat(prompt, params)[0].outputs[0]
    finally:
        manager.wind_down = saved
    assert free.finish_reason == "length"  # the case the rule is for
    assert wound.finish_reason == "stop", wound.text
    assert isinstance(json.loads(wound.text)["numbers"], list)
    same = next(i for i, (a, b) in enumerate(zip(wound.token_ids, free.token_ids)) if a != b)
    assert same >= max_tokens // 3  # untouched until its closing cost comes near
    assert len(wound.token_ids) <= max_tokens
