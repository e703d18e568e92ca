"""Tool-call formats (parsers/<format>.py): whole outputs; streaming == extract for any split."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.frontend.parsers import (
    TOOL_PARSERS,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    get_tool_parser,
)
from radixserve.frontend.parsers.tool_format import BracketScanner

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


def ds_v3(name: str, arguments: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{arguments}\n```{DS_CALL_END}"


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


SAME = object()  # content: the whole output, unchanged
PARIS = '{"city": "Paris"}'
N2 = '{"n": 2}'

# (format, output, content, [(name, arguments)])
CASES: list[tuple[str, str, object, list[tuple[str, str]]]] = [
    # ---- llama3_json
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
     [("get_weather", PARIS)]),
    ("llama3_json", '<|python_tag|>{"name": "f", "arguments": {"a": 1}}', None,
     [("f", '{"a": 1}')]),
    ("llama3_json", '\n {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": "}"}}',
     None, [("a", "{}"), ("b", '{"x": "}"}')]),
    ("llama3_json", '{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {}}', None,
     [("a", "{}"), ("b", "{}")]),
    ("llama3_json", '{"name": "a", "parameters": {}}\n\nDone.', "Done.", [("a", "{}")]),
    ("llama3_json", 'Sure: {"name": "a", "parameters": {}}', SAME, []),
    ("llama3_json", '{"name": "a", "parameters": {"x": }}', SAME, []),
    ("llama3_json", '{"answer": 42}', SAME, []),
    ("llama3_json", '{"name": "a", "parameters": {"x": 1}', SAME, []),
    ("llama3_json", '{"name": "a", "parameters": {}}; {"oops": 1} {"name": "b"}', '; {"oops": 1} '
     '{"name": "b"}', [("a", "{}")]),
    ("llama3_json", "Hello there", SAME, []),
    # ---- mistral
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', None,
     [("get_weather", PARIS)]),
    ("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {}}, '
     '{"name": "b", "arguments": {"n": 1}, "id": "abcdefghi"}]', None,
     [("a", "{}"), ("b", '{"n": 1}')]),
    ("mistral", 'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Let me check.",
     [("get_weather", PARIS)]),
    ("mistral", '[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[CALL_ID]x1y2z3w4v[ARGS]{"k": "}"}', None,
     [("a", "{}"), ("b", '{"k": "}"}')]),
    ("mistral", '[TOOL_CALLS]a{"k": [1]}\nDone', "Done", [("a", '{"k": [1]}')]),
    ("mistral", '[TOOL_CALLS]a[ARGS]{"k": ', SAME, []),
    ("mistral", '[TOOL_CALLS][{"name": 1}] x', SAME, []),
    ("mistral", "[TOOL_CALLS]", SAME, []),
    # ---- qwen3_coder
    ("qwen3_coder", qwen_call("get_weather", city="Paris", days="3"), None,
     [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("qwen3_coder", qwen_call("f", q="two\nlines ", o='{"a": [1, true]}', b="false", n="null"),
     None, [("f", '{"q": "two\\nlines ", "o": {"a": [1, true]}, "b": false, "n": null}')]),
    ("qwen3_coder", "I'll look.\n" + qwen_call("a") + "\n" + qwen_call("b", x="NaN"),
     "I'll look.", [("a", "{}"), ("b", '{"x": "NaN"}')]),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
     "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", []),
    ("qwen3_coder", '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "f", "arguments": {}}</tool_call>', []),
    ("qwen3_coder", "<tool_call>\n<function=f>\n</function>\n", None, [("f", "{}")]),
    # ---- pythonic
    ("pythonic", '[get_weather(city="Paris")]', None, [("get_weather", PARIS)]),
    ("pythonic", "[a(x=1, y=[1, 2.5], z={'k': None}), b.c(flag=True, t=(1,))]", None,
     [("a", '{"x": 1, "y": [1, 2.5], "z": {"k": null}}'), ("b.c", '{"flag": true, "t": [1]}')]),
    ("pythonic", """ [f(s="a]b", t='c\\'d)')]\nDone""", "Done",
     [("f", '{"s": "a]b", "t": "c\'d)"}')]),
    ("pythonic", "Here: [f()]", SAME, []),
    ("pythonic", '[f(x=open("/etc/passwd"))]', SAME, []),
    ("pythonic", "[f(1)]", SAME, []),
    ("pythonic", "[f(x={1, 2})]", SAME, []),
    ("pythonic", "[f(x=1]", SAME, []),
    ("pythonic", "[1, 2]", SAME, []),
    ("pythonic", "[]", SAME, []),
    # ---- phi4_mini
    ("phi4_mini", 'functools[{"name": "f", "arguments": {"a": 1}}]', None, [("f", '{"a": 1}')]),
    ("phi4_mini", 'Sure. functools[{"name": "a", "arguments": {}}, {"name": "b"}]', "Sure.",
     [("a", "{}"), ("b", "{}")]),
    ("phi4_mini", "I like functools and itertools.", SAME, []),
    ("phi4_mini", 'functools[{"name": "f", "arguments": {]', SAME, []),
    # ---- deepseek_v3
    ("deepseek_v3", f"{DS_BEGIN}{ds_v3('get_weather', PARIS)}{DS_END}", None,
     [("get_weather", PARIS)]),
    ("deepseek_v3", f"Checking.\n\n{DS_BEGIN}{ds_v3('a', '{}')}\n{ds_v3('b', N2)}{DS_END}",
     "Checking.", [("a", "{}"), ("b", '{"n": 2}')]),
    ("deepseek_v3", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{PARIS}{DS_CALL_END}"
     f"{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}{DS_END}", None,
     [("get_weather", PARIS), ("now", "{}")]),
    ("deepseek_v3", f"{DS_BEGIN}{ds_v3('a', '{}')}", None, [("a", "{}")]),
    ("deepseek_v3", f"{DS_BEGIN}{ds_v3('a', '{oops')}{DS_END}",
     f"{DS_BEGIN}{ds_v3('a', '{oops')}{DS_END}", []),
    ("deepseek_v3", f"{DS_BEGIN}{DS_END} ok", f"{DS_BEGIN}{DS_END} ok", []),
    # ---- glm45 / glm47, lfm2, nemotron_v2 (more: tests/test_family_templates.py)
    ("glm47", "<tool_call>f<arg_key>a</arg_key><arg_value>x y</arg_value></tool_call>", None,
     [("f", '{"a": "x y"}')]),
    ("glm45", "Ok.\n<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
     "Ok.", [("f", N2)]),
    ("glm45", "<tool_call>f<arg_key>a</arg_key></tool_call>",
     "<tool_call>f<arg_key>a</arg_key></tool_call>", []),
    ("lfm2", "Sure.<|tool_call_start|>[f(n=2), g(b=true)]<|tool_call_end|>", "Sure.",
     [("f", N2), ("g", '{"b": true}')]),
    ("lfm2", "<|tool_call_start|>[f(n=)]<|tool_call_end|>",
     "<|tool_call_start|>[f(n=)]<|tool_call_end|>", []),
    ("nemotron_v2", '<TOOLCALL>[{"name": "f", "arguments": {"n": 2}}]</TOOLCALL>', None,
     [("f", N2)]),
    ("nemotron_v2", '<TOOLCALL>[{"name": "f", "arguments": 2}]</TOOLCALL>',
     '<TOOLCALL>[{"name": "f", "arguments": 2}]</TOOLCALL>', []),
    # ---- gemma4 (more, with its templates and reasoning: tests/test_gemma4_format.py)
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', None,
     [("get_weather", PARIS)]),
    ("gemma4", "Checking.<|tool_call>call:f{n:2}<tool_call|>", "Checking.", [("f", N2)]),
    ("gemma4", "<|tool_call>call:f{n:two}<tool_call|>", SAME, []),
    # ---- hermes (the rest: tests/engine/test_parsers.py)
    ("hermes", 'Hi <tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', "Hi", [("a", "{}")]),
    ("qwen3", '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>', None,
     [("a", "{}"), ("b", "{}")]),
    # ---- harmony (gpt-oss; more, with its reasoning parser: tests/test_harmony.py)
    ("harmony", ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                 '{"city": "Paris"}<|call|>'), None, [("get_weather", PARIS)]),
    ("harmony", ('Checking.<|start|>assistant to=functions.f<|channel|>commentary json'
                 '<|message|>{"n": 2}'), "Checking.", [("f", N2)]),
    ("harmony", '<|channel|>commentary to=functions.f<|message|>{"n": <|call|>', SAME, []),
    ("harmony", "<|channel|>final<|message|>Hi", SAME, []),
]


def parser(name: str) -> ToolCallParser:
    counter = itertools.count()
    return get_tool_parser(name, id_factory=lambda: f"call_{next(counter)}")


def stream(name: str, chunks: list[str]) -> tuple[str | None, list[ToolCall], str | None]:
    """Feed `chunks`; assemble deltas like an OpenAI client; return (content, calls, finish)."""
    state = parser(name).new_stream()
    deltas = [d for chunk in chunks for d in state.feed(chunk)] + state.finish()
    calls: list[ToolCall] = []
    for d in deltas:
        if isinstance(d, str):
            assert d, "empty content delta"
        elif d.index == len(calls):
            assert d.id is not None and d.name is not None and d.arguments_delta == ""
            calls.append(ToolCall(d.id, d.name, ""))
        else:
            assert isinstance(d, ToolCallDelta) and d.index == len(calls) - 1 and d.id is None
            calls[-1].arguments += d.arguments_delta
    content = "".join(d for d in deltas if isinstance(d, str))
    return content or None, calls, state.finish_reason


def splits(text: str, seed: int) -> list[list[str]]:
    """Every two-piece split, one character at a time, and random chunkings."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    rng = random.Random(seed)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 8))))
        out.append([text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])])
    return out


def check_stream_matches_extract(name: str, text: str, seed: int = 0) -> None:
    content, calls = parser(name).extract(text)
    expected = (content, calls, "tool_calls" if calls else None)
    for chunks in splits(text, seed):
        assert stream(name, chunks) == expected, chunks


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_extract_and_stream(name: str, text: str, content: object,
                            calls: list[tuple[str, str]]) -> None:
    got_content, got_calls = parser(name).extract(text)
    assert got_content == (text if content is SAME else content)
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"call_{i}" for i in range(len(calls))]
    check_stream_matches_extract(name, text, seed=len(text))


def test_every_format_has_cases() -> None:
    assert {name for name, *_ in CASES} >= set(TOOL_PARSERS) - {"qwen2_5"}


def test_stream_waits_for_the_whole_call() -> None:
    state = parser("llama3_json").new_stream()
    assert state.feed(' {"name": "a", ') == []
    assert state.feed('"parameters": {"x": "}"}') == []
    assert state.feed("}") == [ToolCallDelta(0, "call_0", "a", ""),
                               ToolCallDelta(0, None, None, '{"x": "}"}')]
    assert state.feed("; ") == []
    assert state.feed("ok") == ["; ok"]
    assert state.feed(' {"name": "b", "parameters": {}}') == [' {"name": "b", "parameters": {}}']
    assert state.finish() == []


def test_leading_format_decides_at_the_first_character() -> None:
    state = parser("pythonic").new_stream()
    assert state.feed("  ") == []
    assert state.feed("I think") == ["  I think"]
    assert state.feed(" [f()]") == [" [f()]"]


def test_mistral_ids_fit_its_templates() -> None:
    _, calls = get_tool_parser("mistral").extract('[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{}')
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls)
    assert calls[0].id != calls[1].id
    _, [call] = get_tool_parser("hermes").extract('<tool_call>{"name": "a"}</tool_call>')
    assert call.id.startswith("call_")


def test_registry_names() -> None:
    for name in TOOL_PARSERS:
        assert isinstance(get_tool_parser(name), ToolCallParser)
    with pytest.raises(ValueError, match="llama3_json"):
        get_tool_parser("auto")


def bracket_end(text: str, quotes: str = '"') -> int | None:
    return BracketScanner(0, quotes)(text)


def test_bracket_scanner() -> None:
    assert bracket_end('{"a": "}"} x') == 10
    assert bracket_end('{"a": "\\"}"}') == 12
    assert bracket_end('{"a": [1, 2]') is None
    assert bracket_end("[f(s='a]')] x", quotes="\"'") == 11
    assert bracket_end("[f(s='a]')] x") == 8  # a single quote is no quote in JSON
    text = '{"a": "x\\"}", "b": [{}]} tail'
    for cut in range(len(text)):  # resumed at any point, as a stream calls it
        scanner = BracketScanner()
        assert scanner(text[:cut]) is None or cut >= 24
        assert scanner(text) == 24


# ---------------------------------------------------------------- fuzz: any text, any split

FRAGMENTS = {
    "llama3_json": ['{"name": "a", "parameters": {"x": [1, "}"]}}', "<|python_tag|>", "; ", "\n",
                    " ", "{", "}", '"', "hi", '{"name": "b"}', "<|py"],
    "mistral": ["[TOOL_CALLS]", "[TOOL_", "a[ARGS]", '{"k": "}"}', "[ARGS]", '[{"name": "a"}]',
                "[", "]", "{", "}", " ", "\n", "hi", "[CALL_ID]abc"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=f>", "</function>",
                    "<parameter=p>", "</parameter>", "\n", "1", "x y", "<tool_", " ", "hi"],
    "pythonic": ["[", "]", "f(", ")", "x=1", ", ", "s='a]'", '"', "'", "\\", " ", "\n", "hi"],
    "phi4_mini": ["functools", "func", "[", "]", '{"name": "a", "arguments": {}}', ", ", "{",
                  "}", " ", "hi"],
    "deepseek_v3": [DS_BEGIN, DS_END, DS_CALL, DS_SEP, DS_CALL_END, "function", "a", "\n```json\n",
                    "{}", "\n```", "<｜tool▁", " ", "\n", "hi"],
    "glm45": ["<tool_call>", "</tool_call>", "f", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>", "k", "1", "<tool_", "<arg_", " ", "\n", "hi"],
    "lfm2": ["<|tool_call_start|>", "<|tool_call_end|>", "<|tool_", "[", "]", "f(", ")", "x=1",
             "b=true", ", ", "'", " ", "\n", "hi"],
    "gemma4": ["<|tool_call>", "<tool_call|>", "<|tool_", "call:f", "{", "}", "[", "]", "n:",
               '<|"|>', ",", "1", " ", "hi"],
    "nemotron_v2": ["<TOOLCALL>", "</TOOLCALL>", "<TOOL", '[{"name": "a", "arguments": {}}]',
                    "[", "]", "{", "}", " ", "\n", "hi"],
}


@st.composite
def fuzz_case(draw: st.DrawFn) -> tuple[str, str, list[int]]:
    """A format, a text of its pieces and whole sample outputs (CASES), and cuts."""
    name = draw(st.sampled_from(sorted(FRAGMENTS)))
    pieces = FRAGMENTS[name] + [text for fmt, text, *_ in CASES if fmt == name]
    text = "".join(draw(st.lists(st.sampled_from(pieces), max_size=8)))
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=10))
    return name, text, cuts


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fuzz_case())
def test_fuzz_stream_matches_extract(case: tuple[str, str, list[int]]) -> None:
    name, text, cuts = case
    content, calls = parser(name).extract(text)
    chunks = [text[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(text)])]
    assert stream(name, chunks) == (content, calls, "tool_calls" if calls else None)
    for call in calls:
        assert isinstance(json.loads(call.arguments), dict)
