"""Reasoning and tool-call output parsers: formats; streaming == non-streaming for any chunking."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.frontend.parsers import (
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    get_reasoning_parser,
    get_tool_parser,
    make_call_id,
)
from radixserve.frontend.parsers.reasoning import BoundaryTrimmer, trim_at_marks

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sequential_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def tool_parser() -> ToolCallParser:
    return ToolCallParser(id_factory=sequential_ids())


def stream_reasoning(parser: ReasoningParser, chunks: list[str]) -> tuple[str | None, str]:
    """Feed `chunks`; return (reasoning or None if never entered, content) as extract would."""
    stream = parser.new_stream()
    reasoning, content = [], []
    for r, c in [*(stream.feed(chunk) for chunk in chunks), stream.finish()]:
        reasoning.append(r)
        content.append(c)
    return ("".join(reasoning) if stream.entered_reasoning else None), "".join(content)


def stream_tools(
    parser: ToolCallParser, chunks: list[str]
) -> tuple[str | None, list[ToolCall], str | None]:
    """Feed `chunks`; assemble deltas like an OpenAI client; return (content, calls, finish)."""
    stream = parser.new_stream()
    deltas = [d for chunk in chunks for d in stream.feed(chunk)] + stream.finish()
    content = "".join(d for d in deltas if isinstance(d, str))
    calls: list[ToolCall] = []
    for d in deltas:
        if isinstance(d, str):
            assert d, "empty content delta"
            continue
        assert isinstance(d, ToolCallDelta)
        if d.index == len(calls):
            assert d.id is not None and d.name is not None
            calls.append(ToolCall(d.id, d.name, d.arguments_delta))
        else:
            assert d.index == len(calls) - 1 and d.id is None and d.name is None
            calls[-1].arguments += d.arguments_delta
    return content or None, calls, stream.finish_reason


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def chunked(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> tuple[str, list[str]]:
    """A text and a random split of it into str chunks (empty chunks included)."""
    text = draw(texts)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=16))
    return text, split_at(text, cuts)


def one_char_chunks(text: str) -> list[str]:
    return list(text)


# ---------------------------------------------------------------- whitespace trimming


@pytest.mark.parametrize(
    ("text", "marks", "expected"),
    [
        (" a b ", [], " a b "),
        (" a b ", [0], "a b "),
        (" a b ", [5], " a b"),
        (" a b ", [0, 5], "a b"),
        (" a \n b ", [3], " a \n b "),
        ("  ", [1], ""),
        ("  ", [], "  "),
    ],
)
def test_trim_at_marks(text: str, marks: list[int], expected: str) -> None:
    assert trim_at_marks(text, marks) == expected


@FUZZ
@given(items=st.lists(st.one_of(st.none(), st.text(alphabet=" \n\tab", max_size=5)), max_size=10))
def test_boundary_trimmer_matches_trim_at_marks(items: list[str | None]) -> None:
    """`None` items are cuts, str items are pieces."""
    trimmer, out, text, marks = BoundaryTrimmer(), [], "", []
    for item in items:
        if item is None:
            trimmer.mark()
            marks.append(len(text))
        else:
            out.append(trimmer.push(item))
            text += item
    assert "".join(out) + trimmer.close() == trim_at_marks(text, marks)


# ---------------------------------------------------------------- reasoning: formats

THINK = ReasoningParser()
OPENED = ReasoningParser(starts_in_reasoning=True)


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        (THINK, "Just an answer.", (None, "Just an answer.")),
        (THINK, "", (None, "")),
        (
            THINK,
            "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
            ("Let me see.", "The answer is 4."),
        ),
        (THINK, "<think></think>Hi", ("", "Hi")),
        (THINK, "<think>\nstill thinking about it", ("still thinking about it", "")),
        (THINK, " <think>x</think>y", (None, " <think>x</think>y")),
        (THINK, "Hi <think>x</think>", (None, "Hi <think>x</think>")),
        (THINK, "<think>a</think>b</think>c", ("a", "b</think>c")),
        (THINK, "<thin", (None, "<thin")),
        (OPENED, "Reasoning here.\n</think>\n\nAnswer", ("Reasoning here.", "Answer")),
        (OPENED, "<think>\nR</think>A", ("R", "A")),
        (OPENED, "never closed", ("never closed", "")),
        (OPENED, "", ("", "")),
        (OPENED, "</think>A", ("", "A")),
        (OPENED, "<thin", ("<thin", "")),
        (ReasoningParser("[T]", "[/T]"), "[T]why[/T] so", ("why", "so")),
    ],
)
def test_reasoning_extract(parser: ReasoningParser, text: str, expected: tuple) -> None:
    assert parser.extract(text) == expected
    assert stream_reasoning(parser, [text]) == expected
    assert stream_reasoning(parser, one_char_chunks(text)) == expected


def test_reasoning_holds_partial_tags() -> None:
    stream = THINK.new_stream()
    assert stream.feed("<thi") == ("", "")
    assert stream.feed("nk>\nStep one") == ("Step one", "")
    assert stream.feed(". \n</th") == (".", "")
    assert stream.feed("ink>\n\nDone") == ("", "Done")
    assert stream.finish() == ("", "")
    assert stream.entered_reasoning


def test_reasoning_partial_start_tag_that_is_content() -> None:
    stream = THINK.new_stream()
    assert stream.feed("<thi") == ("", "")
    assert stream.feed("s is text") == ("", "<this is text")
    assert not stream.entered_reasoning


def test_reasoning_unterminated_block_flushes_on_finish() -> None:
    stream = THINK.new_stream()
    assert stream.feed("<think>hmm </thi") == ("hmm", "")
    assert stream.finish() == (" </thi", "")


def test_reasoning_stream_misuse() -> None:
    stream = THINK.new_stream()
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")
    with pytest.raises(RuntimeError):
        stream.finish()
    with pytest.raises(ValueError):
        ReasoningParser(start_tag="")


def test_reasoning_registry() -> None:
    assert get_reasoning_parser("think") == THINK
    assert get_reasoning_parser("qwen3") == THINK
    assert get_reasoning_parser("deepseek_r1") == OPENED
    assert get_reasoning_parser("qwen3", starts_in_reasoning=True) == OPENED
    with pytest.raises(ValueError, match="deepseek_r1.*qwen3.*think"):
        get_reasoning_parser("nope")


# ---------------------------------------------------------------- reasoning: fuzz

REASONING_FRAGMENTS = [
    "<think>",
    "</think>",
    "<",
    "</",
    "<th",
    "think",
    ">",
    "/",
    "a",
    "é",
    "e\u0301",
    "🙂",
    "👩‍💻",
    "日本",
    "\n",
    " ",
    "\n\n",
    "Answer.",
]
reasoning_texts = st.one_of(
    st.lists(st.sampled_from(REASONING_FRAGMENTS), max_size=12).map("".join),
    st.text(alphabet="<>/thinkx \n🙂", max_size=30),
    st.text(max_size=20),
)


@FUZZ
@given(case=chunked(reasoning_texts), opened=st.booleans())
def test_reasoning_stream_matches_extract(case: tuple[str, list[str]], opened: bool) -> None:
    text, chunks = case
    parser = ReasoningParser(starts_in_reasoning=opened)
    assert stream_reasoning(parser, chunks) == parser.extract(text)


# ---------------------------------------------------------------- tool calls: formats


def block(payload: object) -> str:
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}
NESTED = {"name": "book", "arguments": {"who": "Zoë 🙂", "when": {"d": [1, 2.5, None, True]}}}
MALFORMED = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Hello there.", "Hello there.", []),
        ("", None, []),
        ("  Hi\n", "  Hi\n", []),
        (block(WEATHER), None, [("get_weather", '{"city": "Paris"}')]),
        (
            block(WEATHER) + "\n" + block({"name": "t", "arguments": {}}) + "\n",
            None,
            [("get_weather", '{"city": "Paris"}'), ("t", "{}")],
        ),
        (
            "Let me check.\n\n" + block(WEATHER),
            "Let me check.",
            [("get_weather", '{"city": "Paris"}')],
        ),
        (
            "A\n" + block(WEATHER) + "\nB\n" + block(WEATHER) + " C ",
            "A\n\nB\n C ",
            [("get_weather", '{"city": "Paris"}')] * 2,
        ),
        (block(NESTED), None, [("book", json.dumps(NESTED["arguments"], ensure_ascii=False))]),
        (block({"name": "noargs"}), None, [("noargs", "{}")]),
        (MALFORMED, MALFORMED, []),
        (
            "x " + MALFORMED + "\n" + block(WEATHER),
            "x " + MALFORMED,
            [("get_weather", '{"city": "Paris"}')],
        ),
        (block({"name": "f", "arguments": "[1]"}), block({"name": "f", "arguments": "[1]"}), []),
        (block({"arguments": {}}), block({"arguments": {}}), []),
        (block([1, 2]), block([1, 2]), []),
        ('<tool_call>\n{"name": "f", "arguments": {}}', None, [("f", "{}")]),
        ('<tool_call>\n{"name": "f", "argu', '<tool_call>\n{"name": "f", "argu', []),
        ("<tool_ca", "<tool_ca", []),
    ],
)
def test_tool_extract(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    got_content, got_calls = tool_parser().extract(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"call_{i:024x}" for i in range(len(calls))]
    for chunks in ([text], one_char_chunks(text)):
        assert stream_tools(tool_parser(), chunks) == (
            content,
            got_calls,
            "tool_calls" if calls else None,
        )


def test_tool_arguments_are_unescaped_unicode_json() -> None:
    body = '{"name": "f", "arguments": {"city": "Z\\u00fcrich", "n": [1,{"k":null}]}}'
    text = f"<tool_call>{body}</tool_call>"
    _, [call] = tool_parser().extract(text)
    assert call.arguments == '{"city": "Zürich", "n": [1, {"k": null}]}'


def test_tool_stream_deltas_shape_and_partial_tags() -> None:
    stream = tool_parser().new_stream()
    assert stream.feed("Checking. <tool_") == ["Checking."]
    assert stream.feed('call>\n{"name": "get_weather", ') == []
    assert stream.feed('"arguments": {"city": "Paris"}}\n</tool') == []
    assert stream.finish_reason is None
    assert stream.feed("_call>\n") == [
        ToolCallDelta(0, "call_" + "0" * 24, "get_weather", ""),
        ToolCallDelta(0, None, None, '{"city": "Paris"}'),
    ]
    assert stream.finish() == []
    assert stream.has_tool_calls and stream.finish_reason == "tool_calls"


def test_tool_stream_misuse_and_ids() -> None:
    stream = tool_parser().new_stream()
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")
    assert re.fullmatch(r"call_[0-9a-f]{24}", make_call_id())
    assert make_call_id() != make_call_id()
    _, [call] = ToolCallParser().extract(block(WEATHER))
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)


def test_tool_registry() -> None:
    for name in ("hermes", "qwen2_5", "qwen3"):
        assert isinstance(get_tool_parser(name), ToolCallParser)
    ids = sequential_ids()
    assert get_tool_parser("hermes", id_factory=ids).id_factory is ids
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("no_such_format")


# ---------------------------------------------------------------- tool calls: fuzz

TOOL_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "</tool",
    "<",
    ">",
    "\n",
    " ",
    "Hi",
    "日本語",
    "e\u0301",
    "👩‍💻",
    json.dumps(WEATHER),
    json.dumps(NESTED, ensure_ascii=False),
    '{"name": "noargs"}',
    '{"name": "x", "arguments": {',
    "[1, 2]",
    "not json",
]
tool_texts = st.one_of(
    st.lists(st.sampled_from(TOOL_FRAGMENTS), max_size=12).map("".join),
    st.text(alphabet='<>/tool_cal{}" \n🙂', max_size=40),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def call_texts(draw: st.DrawFn) -> str:
    """Content, then calls with random JSON arguments, in either JSON escaping style."""
    parts = [draw(st.text(max_size=10))]
    for _ in range(draw(st.integers(0, 3))):
        payload = {
            "name": draw(st.sampled_from(["f", "ünï", "get_x"])),
            "arguments": draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        }
        sep = draw(st.sampled_from(["", "\n", " \n"]))
        ascii_only = draw(st.booleans())
        parts.append(
            f"<tool_call>{sep}{json.dumps(payload, ensure_ascii=ascii_only)}{sep}</tool_call>"
        )
        parts.append(draw(st.sampled_from(["", "\n", "\n\n", " then "])))
    return "".join(parts)


def check_tool_invariants(text: str, chunks: list[str]) -> None:
    content, calls = tool_parser().extract(text)
    assert stream_tools(tool_parser(), chunks) == (content, calls, "tool_calls" if calls else None)


@FUZZ
@given(case=chunked(tool_texts))
def test_tool_stream_matches_extract(case: tuple[str, list[str]]) -> None:
    check_tool_invariants(*case)


@settings(FUZZ, max_examples=80)
@given(case=chunked(call_texts()))
def test_tool_stream_matches_extract_on_calls(case: tuple[str, list[str]]) -> None:
    text, chunks = case
    check_tool_invariants(text, chunks)
    for call in tool_parser().extract(text)[1]:
        assert call.arguments == json.dumps(json.loads(call.arguments), ensure_ascii=False)
