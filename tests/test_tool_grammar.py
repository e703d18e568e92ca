"""tool_choice auto's grammar in the Hermes format (frontend/parsers/tool_grammar.py): text, or
text and then well-formed calls of the request's tools; it rolls back (speculative decoding)."""

from __future__ import annotations

import llguidance
import pytest

from radixserve.frontend.parsers import get_tool_parser
from radixserve.frontend.parsers.tool_grammar import auto_tools_grammar
from radixserve.models.source import ModelSource
from radixserve.tokenizer.tokenizer import load_tokenizer

TOOLS = [("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}),
         ("get_time", {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}}),
         ("ping", None)]
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
PING = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def lltok():
    tokenizer = load_tokenizer(ModelSource.resolve(None))
    eos = sorted(tokenizer.eos_token_ids)
    return tokenizer, llguidance.LLTokenizer(tokenizer.backend.to_str(),
                                             n_vocab=tokenizer.vocab_size, eos_token=eos)


def accepts(lltok, grammar: str, text: str) -> bool:
    tokenizer, lt = lltok
    matcher = llguidance.LLMatcher(lt, llguidance.grammar_from("lark", grammar))
    ids = tokenizer.encode(text, add_special_tokens=False) + [sorted(tokenizer.eos_token_ids)[0]]
    return all(matcher.consume_token(t) for t in ids) and matcher.is_stopped()


@pytest.mark.parametrize("text, parallel, ok", [
    ("Paris is sunny today, I think.", True, True),
    ("a < b, and <tool> is not the marker", True, True),
    (WEATHER, True, True),
    ("Let me check. " + WEATHER, True, True),
    (WEATHER + "\n" + TIME + "\n" + PING, True, True),
    (WEATHER + "\n" + TIME, False, False),  # one call when parallel_tool_calls is false
    (WEATHER, False, True),
    ('<tool_call>\n{"name": "get_wether", "arguments": {"city": "Paris"}}\n</tool_call>', True,
     False),  # an unknown name
    ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', True, False),
    ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "PST"}}\n</tool_call>', True,
     False),
    ("Some <tool_call> text", True, False),  # the marker opens a call
    ('<tool_call>\n{"name": "get_weather"', True, False),  # unfinished
])
def test_answers(lltok, text, parallel, ok):
    assert accepts(lltok, auto_tools_grammar(TOOLS, parallel), text) is ok


def test_rolls_back_for_speculative_decoding(lltok):
    tokenizer, lt = lltok
    matcher = llguidance.LLMatcher(lt, llguidance.grammar_from("lark", auto_tools_grammar(
        TOOLS, True)))
    ids = tokenizer.encode("Let me check. " + WEATHER, add_special_tokens=False)
    for token in ids:
        assert matcher.consume_token(token)
    assert matcher.rollback(len(ids) // 2) and not matcher.is_error()


def test_what_it_accepts_the_hermes_parser_reads():
    content, calls = get_tool_parser("hermes").extract("Let me check. " + WEATHER + "\n" + PING)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather", "ping"]
