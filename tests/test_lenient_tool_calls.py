"""Tool calls written as plain JSON (frontend/parsers/lenient_json.py): what is and is not a
call, on answers recorded from Qwen2.5-Coder-1.5B (tests/recorded/) and on written ones;
streamed == whole for any chunking; where the chat endpoint uses the parser."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.openai.serving_chat import ChatServer
from radixserve.frontend.parsers import ForcedToolParser, ToolCall, ToolCallDelta, get_tool_parser
from radixserve.frontend.parsers.lenient_json import LenientToolParser
from radixserve.tokenizer.tokenizer import Tokenizer

RECORDED = json.loads((Path(__file__).parent / "recorded" /
                       "qwen2_5_coder_1_5b_tool_answers.json").read_text())
TOOLS = {t["function"]["name"]: t["function"]["parameters"] for t in RECORDED["tools"]}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sequential_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def lenient(fmt: str = "hermes", parallel: bool = True, tools=TOOLS) -> LenientToolParser:
    return LenientToolParser(get_tool_parser(fmt, id_factory=sequential_ids()), tools, parallel)


def calls_of(text: str, **kw) -> list[tuple[str, dict]] | None:
    """The calls read from a whole answer; None when it stays content (all of it)."""
    content, calls = lenient(**kw).extract(text)
    if not calls:
        assert content == (text or None)
        return None
    assert content is None
    return [(c.name, json.loads(c.arguments)) for c in calls]


def streamed(parser: LenientToolParser, chunks: list[str]):
    """(content, calls, finish reason) assembled from the stream's deltas, as a client does."""
    stream = parser.new_stream()
    deltas = [d for chunk in chunks for d in stream.feed(chunk)] + stream.finish()
    calls: list[ToolCall] = []
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            if d.index == len(calls):
                calls.append(ToolCall(d.id, d.name, d.arguments_delta))
            else:
                calls[d.index].arguments += d.arguments_delta
    content = "".join(d for d in deltas if isinstance(d, str))
    return content or None, calls, stream.finish_reason


@pytest.mark.parametrize("case", RECORDED["answers"], ids=lambda c: c["answer"][:24])
def test_recorded_answers(case: dict) -> None:
    expected = [tuple(call) for call in case["calls"]] or None
    assert calls_of(case["answer"]) == expected
    # the same reading whatever format the server parses (Llama 3 JSON reads bare JSON too)
    assert calls_of(case["answer"], fmt="llama3_json") == expected


PARIS = ("get_weather", {"city": "Paris"})
ADD = ("add", {"a": 1, "b": 2})


@pytest.mark.parametrize("text, expected", [
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [PARIS]),
    ('```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n', [PARIS]),
    ('``` JSON\n{"name": "get_weather", "arguments": {"city": "Paris"}}```', [PARIS]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', [PARIS]),  # cut
    ('  {"name": "get_weather", "arguments": {"city": "Paris"}}\n', [PARIS]),
    ('{{"name": "get_weather", "arguments": {"city": "Paris"}}}', [PARIS]),
    ('```json\n{{"name": "add", "arguments": {"a": 1, "b": 2}}}\n```', [ADD]),
    # every brace doubled, as the template's example: the real Qwen2.5-Coder-1.5B answer under
    # the OpenAI Agents SDK (its instructions as the system message), benchmarks/client_checks.py
    ('{{"name": "get_weather", "arguments": {"city": "Paris"}}}}', [PARIS]),
    ('{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}', [PARIS]),
    ('```json\n{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}\n```', [ADD]),
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', [PARIS]),
    ('{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}', [PARIS]),
    ('{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
     [PARIS]),
    ('{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
    ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1, "b": 2}}]', [PARIS, ADD]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '{"name": "add", "arguments": {"a": 1, "b": 2}}', [PARIS, ADD]),
    ('{"name": "add", "arguments": {"a": 1.0, "b": 2}}', [("add", {"a": 1.0, "b": 2})]),
])
def test_forms_read_as_calls(text: str, expected: list) -> None:
    assert calls_of(text) == expected


@pytest.mark.parametrize("text", [
    '{"name": "get_time", "arguments": {}}',  # not an offered tool
    '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # misses the required city
    '{"name": "get_weather", "arguments": {"city": 7}}',  # wrong type
    '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}}',  # not in enum
    '{"name": "add", "arguments": {"a": 1.5, "b": 2}}',  # not an integer
    '{"name": "add", "arguments": {"a": true, "b": 2}}',  # a boolean is not a number
    '{"name": "get_weather", "arguments": {"city": "Paris"}, "note": "x"}',  # another key
    '{"name": "get_weather", "arguments": ["Paris"]}',
    '{"name": "get_weather", "arguments": "Paris"}',
    '{"type": "tool", "name": "get_weather", "arguments": {"city": "Paris"}}',
    '[]',
    '{"name": "Alice", "age": 30}',
    'Call: {"name": "get_weather", "arguments": {"city": "Paris"}}',  # text before
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and then?',  # text after
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nDone.',
    '```python\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '```json\n```',
    '{"name": "get_weather", "arguments": {"city": "Par',  # cut short
    '{"name": "get_weather", "arguments": {"city": "Paris"}}}',
    'Hello!',
    '',
])
def test_other_answers_stay_content(text: str) -> None:
    assert calls_of(text) is None


def test_one_call_unless_parallel_calls_are_allowed() -> None:
    two = ('[{"name": "add", "arguments": {"a": 1, "b": 2}}, '
           '{"name": "add", "arguments": {"a": 3, "b": 4}}]')
    assert calls_of(two, parallel=False) is None
    assert calls_of(two[1:two.index("}}") + 2], parallel=False) == [ADD]


def test_a_tool_without_parameters_takes_any_object() -> None:
    tools = {"now": None}
    assert calls_of('{"name": "now"}', tools=tools) == [("now", {})]
    assert calls_of('{"name": "now", "arguments": {"tz": "UTC"}}', tools=tools) == [
        ("now", {"tz": "UTC"})]


def test_the_formats_own_calls_come_first() -> None:
    tagged = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert calls_of(tagged) == [("get_time", {})]  # the format's parser does not check names
    llama = '{"name": "get_time", "parameters": {}}'  # Llama 3 JSON is bare JSON itself
    assert calls_of(llama, fmt="llama3_json") == [("get_time", {})]
    assert calls_of(llama) is None


def test_the_stream_holds_back_only_what_may_become_a_call() -> None:
    stream = lenient().new_stream()
    assert stream.feed("```js") == []
    assert stream.feed("on\n{\"name\": \"add\", ") == []
    assert stream.feed('"arguments": {"a": 1, "b": 2}}\n`') == []
    assert stream.feed("``") == [] and not stream.has_tool_calls
    assert [(d.index, d.name, d.arguments_delta) for d in stream.finish()] == [
        (0, "add", ""), (0, None, '{"a": 1, "b": 2}')]
    assert stream.finish_reason == "tool_calls"
    stream = lenient().new_stream()
    assert stream.feed("```py") == ["```py"]  # decided: not JSON
    assert stream.feed("thon\nx") == ["thon\nx"]
    stream = lenient().new_stream()
    assert stream.feed("  Sure") == ["  Sure"]
    stream = lenient().new_stream()
    assert stream.feed('{"name": "Alice"') == []
    assert stream.feed(', "age": 30}') == ['{"name": "Alice", "age": 30}']  # not a call


ANSWERS = [case["answer"] for case in RECORDED["answers"]] + [
    '{{"name": "add", "arguments": {"a": 1, "b": 2}}}',
    '{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}',
    '```json\n{{"name": "get_weather", "arguments": {"city": "Paris"}}}}\n```',
    '{{"name": "add", "arguments": {"a": 1, "b": 2}}}}}',
    '{{ "x" }}',
    'Text first <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call> after',
    '```json\n[{"name": "add", "arguments": {"a": 1, "b": 2}}]\n``` trailing',
    '{"name": "get_weather", "arguments": {"city": "Pa',
    '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
    '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
    "``",
    "  \n",
]


@st.composite
def chunked(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.sampled_from(ANSWERS))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@FUZZ
@given(case=chunked(), fmt=st.sampled_from(["hermes", "llama3_json", "mistral"]),
       parallel=st.booleans())
def test_streamed_equals_whole(case: tuple[str, list[str]], fmt: str, parallel: bool) -> None:
    text, chunks = case
    content, calls = lenient(fmt, parallel).extract(text)
    finish = "tool_calls" if calls else None
    assert streamed(lenient(fmt, parallel), chunks) == (content, calls, finish)


# -- where the chat endpoint uses it -----------------------------------------------------------

def _server() -> ChatServer:
    backend = HFTokenizer(WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer = Tokenizer(backend, bos_token_id=0, eos_token_id=1,
                          chat_template=(Path(__file__).parent / "chat_templates" /
                                         "qwen2_5.jinja").read_text())
    engine = SimpleNamespace(tokenizer=tokenizer, max_model_len=4096)
    return ChatServer(ServingContext(engine, "m", tool_parser=get_tool_parser("hermes"),
                                     tool_call_grammar=False))


@pytest.mark.parametrize("fields, kind", [
    ({"tools": RECORDED["tools"]}, LenientToolParser),
    ({"tools": RECORDED["tools"], "tool_choice": "auto"}, LenientToolParser),
    ({"tools": RECORDED["tools"], "tool_choice": "none"}, type(None)),
    ({}, type(None)),  # never when no tool was offered
    ({"tools": RECORDED["tools"], "tool_choice": "required"}, ForcedToolParser),
])
def test_chat_requests_that_get_the_lenient_parser(fields: dict, kind: type) -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], **fields})
    parser = asyncio.run(_server().prepare(body))[2].tools
    assert type(parser) is kind
    if kind is LenientToolParser:
        assert dict(parser.tools) == TOOLS and parser.parallel


def test_a_fence_streamed_before_its_doubled_braces_is_still_a_call():
    # the fence's line alone first: whether the braces are doubled is not known until the value
    text = '```json\n{{"name": "get_weather", "arguments": {"city": "Paris"}}}}\n```'
    content, calls = lenient("hermes", False).extract(text)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    for cut in (8, 9, 10):
        assert streamed(lenient("hermes", False), [text[:cut], text[cut:]]) == \
            (content, calls, "tool_calls")
