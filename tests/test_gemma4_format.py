"""Gemma 4's tool calls and reasoning (parsers/gemma4.py, the ``gemma4`` reasoning preset):
its released chat templates (tests/chat_templates/google-gemma-4-31B-it*.jinja, copied from
llama.cpp's models/templates) render our history as transformers does, are detected, and the
outputs written the way they show the model writing them parse, streamed in any split as
whole; the value syntax's corner cases (llama.cpp common/parsers/gemma4.cpp) and malformed
calls, which stay text.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_family_templates import (
    Family,
    conversation,
    ours,
    streamed,
    transformers_render,
    whole,
)
from test_tool_detect import decoded
from tiny_models import _tokenizer_json
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from radixserve.frontend.parsers import ReasoningParser, get_reasoning_parser, get_tool_parser
from radixserve.frontend.parsers.detect import (
    detect_reasoning_parser,
    detect_tool_format,
    reasoning_parser_for,
)
from radixserve.frontend.parsers.gemma4 import parse_value
from radixserve.serve import _tool_parser
from radixserve.tokenizer.tokenizer import Tokenizer

Q = '<|"|>'
GEMMA4 = Family("google-gemma-4-31B-it", "gemma4", "gemma4", {})
INTERLEAVED = Family("google-gemma-4-31B-it-interleaved", "gemma4", "gemma4", {})
ON = {"enable_thinking": True}


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{body}<tool_call|>"


# ------------------------------------------------------------------ templates


@pytest.mark.parametrize("family", [GEMMA4, INTERLEAVED], ids=lambda f: f.template)
def test_detected(family: Family) -> None:
    assert detect_tool_format(family.source) == "gemma4"
    assert detect_reasoning_parser(family.source) == "gemma4"


@pytest.mark.parametrize("kwargs", [ON, {}], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("family", [GEMMA4, INTERLEAVED], ids=lambda f: f.template)
def test_renders_as_transformers(family: Family, kwargs: dict) -> None:
    """The OpenAI form (arguments a JSON string) renders as transformers renders the dict."""
    text = ours(family, conversation("You are terse.", openai=True), **kwargs)
    assert text == transformers_render(family, conversation("You are terse.", openai=False),
                                       **kwargs)
    assert call("get_weather", f"{{city:{Q}Paris{Q},days:3}}") in text
    assert text.startswith("<s><|turn>system\n<|think|>\n") == bool(kwargs)


NESTED = {"q": "naïve \"quotes\", {braces}: [x]", "n": -2.5e-3, "flag": False, "ok": True,
          "tags": ["a", 1, [], {}], "opts": {"depth": {"k": [1.5, "v"]}, "empty": ""}}


def test_the_rendered_call_parses_back() -> None:
    """The template's ``format_argument`` writes any JSON arguments (but null, which it writes
    as Python's ``None``) in a form the parser reads back to the same object."""
    arguments = json.dumps(NESTED)
    text = ours(GEMMA4, conversation("s", openai=True, arguments=arguments))
    fn = {"name": "get_weather", "arguments": NESTED}
    messages = conversation("s", openai=False)
    messages[2]["tool_calls"][0]["function"] = fn
    assert text == transformers_render(GEMMA4, messages)
    block = text[text.index("<|tool_call>") : text.index("<tool_call|>") + len("<tool_call|>")]
    _, [parsed] = get_tool_parser("gemma4").extract(block)
    assert (parsed.name, json.loads(parsed.arguments)) == ("get_weather", NESTED)


def test_the_prompt_decides_where_the_output_starts() -> None:
    """Thinking off, the template writes an empty thought block; on, the model opens it."""
    parser = get_reasoning_parser("gemma4")
    assert (parser.start_tag, parser.end_tag) == ("<|channel>thought", "<channel|>")
    for kwargs in (ON, {}):
        prompt = ours(GEMMA4, conversation("s", openai=True)[:2], **kwargs)
        assert prompt.endswith("<|channel>thought\n<channel|>") != bool(kwargs)
        assert not parser.for_prompt(prompt).starts_in_reasoning


# ------------------------------------------------------------------ outputs

PARIS3 = [("get_weather", '{"city": "Paris", "days": 3}')]
PARIS_CALL = call("get_weather", f"{{city:{Q}Paris{Q},days:3}}")
OUTPUTS = [  # (thinking, output, reasoning, content, calls)
    (True, "<|channel>thought\nThe user wants the weather.<channel|>" + PARIS_CALL,
     "The user wants the weather.", None, PARIS3),
    (True, "<|channel>thought\nEasy.<channel|>It is 22 C in Paris.", "Easy.",
     "It is 22 C in Paris.", []),
    (False, "Let me check." + PARIS_CALL + call("get_weather", f"{{city:{Q}Rome{Q}}}"), None,
     "Let me check.", [*PARIS3, ("get_weather", '{"city": "Rome"}')]),
    (False, "It is sunny in Paris.", None, "It is sunny in Paris.", []),
    (False, call("get_weather", "{city:Paris}"), None, call("get_weather", "{city:Paris}"), []),
    (True, "<|channel>thought\nHmm.<channel|>" + call("get_weather", f"{{city:{Q}Paris{Q}"),
     "Hmm.", call("get_weather", f"{{city:{Q}Paris{Q}"), []),
]


@pytest.mark.parametrize(("thinking", "text", "thought", "content", "calls"), OUTPUTS)
def test_outputs(thinking: bool, text: str, thought: str | None, content: str | None,
                 calls: list) -> None:
    prompt = ours(GEMMA4, conversation("s", openai=True)[:2], **(ON if thinking else {}))
    reasoning = get_reasoning_parser("gemma4").for_prompt(prompt)
    tools = get_tool_parser("gemma4")
    expected = whole(reasoning, tools, text)
    assert expected == (thought, content, calls)
    for cut in range(len(text) + 1):
        assert streamed(reasoning, tools, [text[:cut], text[cut:]]) == expected, cut
    assert streamed(reasoning, tools, list(text)) == expected


# ------------------------------------------------------------------ the value syntax

VALUES = [
    (f"{Q}{Q}", ""),
    (f"{Q}a, b: {{c}} [d] \"e\" \\n{Q}", 'a, b: {c} [d] "e" \\n'),  # no escapes in strings
    (f"{Q}line\nbreak{Q}", "line\nbreak"),
    ("0", 0), ("-12", -12), ("3.25", 3.25), ("1e-05", 1e-05), ("2E+3", 2000.0),
    ("true", True), ("false", False), ("null", None),
    ("[]", []), ("{}", {}), (" [ 1 , [2], {a:[]} ] ", [1, [2], {"a": []}]),
    (f"{{ a : 1 ,\n b:{Q}x{Q} }}", {"a": 1, "b": "x"}),  # whitespace between tokens
    (f"{{{Q}quoted:key{Q}:1}}", {"quoted:key": 1}),  # keys quoted as in the declarations
    ("{a b:1}", {"a b": 1}), ("{a:1,a:2}", {"a": 2}),
    (f"{{nested:{{deeper:{{x:[{Q}y{Q}]}}}}}}", {"nested": {"deeper": {"x": ["y"]}}}),
]
BAD_VALUES = ["", "Paris", f"{Q}open", "{a:1", "{a:1,}", "[1,]", "[1 2]", "{:1}", "{a}",
              "01", "1.", ".5", "+1", "True", "None", "nullx", "{a:1}}", "{a:1} x", "[" * 5000,
              "1" * 5000, "{a:'x'}", '{a:"x"}']


@pytest.mark.parametrize(("text", "value"), VALUES)
def test_values(text: str, value: object) -> None:
    assert parse_value(text) == value


@pytest.mark.parametrize("text", BAD_VALUES, ids=lambda t: t[:20])
def test_bad_values(text: str) -> None:
    with pytest.raises(ValueError):
        parse_value(text)


@pytest.mark.parametrize("body", [
    "{}", f"{{city:{Q}Paris{Q}}}", "[1]", f"{Q}x{Q}", "{a:1e999}", "{city:Paris}", "{a:1",
    "", "{}x"])
def test_a_block_is_a_call_or_text(body: str) -> None:
    """Arguments must be one object (JSON can hold): anything else keeps the block as text."""
    text = f"Hi {call('f', body)} there"
    content, calls = get_tool_parser("gemma4").extract(text)
    is_call = body in ("{}", f"{{city:{Q}Paris{Q}}}")
    assert (content, len(calls)) == (("Hi  there", 1) if is_call else (text, 0))
    for prefix in ("call :f", "call:{}", "f{}", "call:a b{}"):
        assert get_tool_parser("gemma4").extract(f"<|tool_call>{prefix}<tool_call|>")[1] == []


FRAGMENTS = ["<|tool_call>", "<tool_call|>", "call:", "f", "{", "}", "[", "]", ":", ",", Q,
             "<|", "<tool_", "a", "1", "true", " ", "\n", "hi", PARIS_CALL, "call:f{}"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=10),
       cuts=st.lists(st.integers(0, 400), max_size=8))
def test_fuzz_stream_matches_extract(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    parser = get_tool_parser("gemma4", id_factory=itertools.count().__next__)
    content, calls = parser.extract(text)
    stream = get_tool_parser("gemma4", id_factory=itertools.count().__next__).new_stream()
    bounds = sorted(min(c, len(text)) for c in cuts)
    deltas = [d for a, b in itertools.pairwise([0, *bounds, len(text)])
              for d in stream.feed(text[a:b])] + stream.finish()
    assert "".join(d for d in deltas if isinstance(d, str)) == (content or "")
    got = [(d.name, d.arguments_delta) for d in deltas if not isinstance(d, str)]
    assert got == [x for c in calls for x in ((c.name, ""), (None, c.arguments))]
    for c in calls:
        assert isinstance(json.loads(c.arguments), dict)


# ------------------------------------------------------------------ the server's tokenizer

MARKERS = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", Q)


def test_markers_that_are_special_tokens_reach_the_parsers() -> None:
    """Gemma 4's markers are special tokens, skipped in decoding; detection keeps the ones its
    parsers read, so that a decoded output splits into reasoning and a call."""
    backend = HFTokenizer.from_str(_tokenizer_json())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MARKERS])
    tok = Tokenizer(backend, eos_token_id=backend.token_to_id("<|im_end|>"),
                    chat_template=GEMMA4.source)
    text = "<|channel>thought\nParis.<channel|>" + call("get_weather", f"{{city:{Q}Paris{Q}}}")
    assert decoded(tok, text) == "thought\nParis.call:get_weather{city:Paris}"
    name, reasoning, why = reasoning_parser_for("auto", tok)
    assert name == "gemma4" and isinstance(reasoning, ReasoningParser)
    assert why == "from the chat template; special tokens decoded as text: <|channel> <channel|>"
    assert _tool_parser("auto", tok)[0] == "gemma4"
    output = decoded(tok, text)
    assert output == text
    thought, content = reasoning.extract(output)
    _, [parsed] = get_tool_parser("gemma4").extract(content)
    assert (thought, parsed.name, json.loads(parsed.arguments)) == (
        "Paris.", "get_weather", {"city": "Paris"})
