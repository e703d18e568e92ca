"""gpt-oss's harmony format (frontend/parsers/harmony.py) with its released chat template
(tests/chat_templates/openai-gpt-oss-120b.jinja, from llama.cpp's models/templates).

Detection from the template (tool format and reasoning parser ``harmony``, their markers kept as
text where they are special tokens); rendering = transformers for a system or developer prompt,
tools, ``reasoning_effort`` from each API, an earlier call with its reasoning and its result;
the parsers on outputs written as the template shows the model writing them, whole and streamed
in every split, malformed calls as text. The server-level test is
tests/server/test_harmony_chat.py.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_models import _tokenizer_json
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from radixserve.frontend.anthropic.protocol import MessagesRequest
from radixserve.frontend.ollama.protocol import OllamaChatRequest
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.serving import ChatParsers
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.parsers import ToolCall, get_reasoning_parser, get_tool_parser
from radixserve.frontend.parsers.detect import (
    detect_reasoning_parser,
    detect_tool_format,
    reasoning_parser_for,
)
from radixserve.frontend.parsers.harmony import FORMAT, MARKERS, HarmonyReasoningParser
from radixserve.frontend.responses.protocol import ResponsesRequest
from radixserve.frontend.responses.serving import chat_messages, chat_request, stored_items
from radixserve.tokenizer.tokenizer import Tokenizer

TEMPLATE = (Path(__file__).parent / "chat_templates" / "openai-gpt-oss-120b.jinja").read_text()
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]
ARGS = {"city": "Paris", "days": 3}


def tokenizer(specials: tuple[str, ...] = ()) -> Tokenizer:
    """The tiny test vocabulary with the gpt-oss template, `specials` added as special tokens."""
    backend = HFTokenizer.from_str(_tokenizer_json())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return Tokenizer(backend, eos_token_id=backend.token_to_id("<|im_end|>"),
                     chat_template=TEMPLATE)


# ------------------------------------------------------------------ detection


def test_the_template_is_detected_as_harmony() -> None:
    assert detect_tool_format(TEMPLATE) == "harmony"
    assert detect_reasoning_parser(TEMPLATE) == "harmony"
    assert isinstance(get_reasoning_parser("harmony"), HarmonyReasoningParser)
    assert get_tool_parser("harmony").format is FORMAT


def test_markers_that_are_special_tokens_reach_the_parsers_as_text() -> None:
    tok = tokenizer(MARKERS)
    name, parser, why = reasoning_parser_for("auto", tok)
    assert name == "harmony" and all(m in why for m in MARKERS), why
    text = ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Hi.<|return|>")
    ids = tok.encode(text, add_special_tokens=False)
    assert sum(i in tok.all_special_ids for i in ids) == 7  # each marker one special token
    detok = tok.detokenizer([])
    decoded = detok.step(ids) + detok.flush()
    assert decoded == text
    assert parser.extract(decoded) == ("Hm.", "Hi.")


# ------------------------------------------------------------------ rendering


def conversation(first_role: str, *, openai: bool, answered: bool) -> list[dict]:
    """A tool round trip: the call with its reasoning, its result, then (``answered``) the
    final answer and a new question. ``openai``: as a client sends it (arguments a JSON
    string, ``reasoning_content``), else as transformers documents it (a dict, ``thinking``)."""
    fn = {"name": "get_weather", "arguments": json.dumps(ARGS) if openai else ARGS}
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": fn}]}
    call.update({"content": None, "reasoning_content": "Need the weather."} if openai
                else {"thinking": "Need the weather."})
    messages = [{"role": first_role, "content": "You are terse."},
                {"role": "user", "content": "Weather in Paris?"}, call,
                {"role": "tool", "tool_call_id": "c1", "content": "22 C"}]
    if answered:
        messages += [{"role": "assistant", "content": "22 C and sunny."},
                     {"role": "user", "content": "And Rome?"}]
    return messages


def ours(body: dict) -> str:
    return render_messages(SimpleNamespace(tokenizer=tokenizer()),
                           ChatCompletionRequest.model_validate(body))


def theirs(messages: list[dict], **kwargs) -> str:
    rendered, _ = render_jinja_template([messages], tools=TOOLS, chat_template=TEMPLATE,
                                        add_generation_prompt=True, **kwargs)
    return rendered[0]


@pytest.mark.parametrize("first_role", ["system", "developer"])
@pytest.mark.parametrize("answered", [False, True])
@pytest.mark.parametrize("effort", [None, "high"])
def test_renders_as_transformers(first_role: str, answered: bool, effort: str | None) -> None:
    body = {"messages": conversation(first_role, openai=True, answered=answered),
            "tools": TOOLS, "reasoning_effort": effort}
    kwargs = {} if effort is None else {"reasoning_effort": effort}
    text = ours(body)
    assert text == theirs(conversation(first_role, openai=False, answered=answered), **kwargs)
    assert f"Reasoning: {effort or 'medium'}" in text
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Paris", "days": 3}<|call|>') in text
    # the call's reasoning stays while the loop is open, as the template decides
    assert ("<|channel|>analysis<|message|>Need the weather.<|end|>" in text) != answered
    assert text.endswith("<|start|>assistant")


def test_a_call_with_text_and_reasoning_still_renders() -> None:
    """The template refuses ``thinking`` beside a call's text (a preamble, as the Responses
    items of one turn come back); the text is then the call's analysis, as without reasoning."""
    messages = conversation("system", openai=True, answered=False)
    messages[2]["content"] = "Checking."
    text = ours({"messages": messages, "tools": TOOLS})
    assert "<|channel|>analysis<|message|>Checking.<|end|><|start|>assistant to=" in text


def test_reasoning_effort_reaches_the_template_from_every_api() -> None:
    """Responses ``reasoning.effort``, Ollama ``think: "low"``, Anthropic
    ``output_config.effort``; Responses and Ollama history carry the reasoning too."""
    responses = ResponsesRequest.model_validate({"model": "m", "reasoning": {"effort": "low"},
                                                 "input": "Hi"})
    body = chat_request(responses, chat_messages(None, stored_items(responses.input_items())))
    assert "Reasoning: low" in ours(body.model_dump(exclude_none=True))
    ollama = OllamaChatRequest.model_validate({"model": "m", "think": "high", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "thinking": "Need it.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "content": "22 C", "tool_name": "get_weather"}]})
    text = ours({**ollama.to_openai(), "tools": TOOLS})
    assert "Reasoning: high" in text and "<|message|>Need it.<|end|>" in text
    anthropic = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "output_config": {"effort": "high"},
        "messages": [{"role": "user", "content": "Hi"}]})
    assert "Reasoning: high" in ours(anthropic.to_chat().model_dump(exclude_none=True))


def test_responses_reasoning_items_reach_the_call_they_precede() -> None:
    items = stored_items(ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Need it."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": json.dumps(ARGS)},
        {"type": "function_call_output", "call_id": "c1", "output": "22 C"}]}).input_items())
    messages = chat_messages(None, items)
    assert messages[1]["reasoning_content"] == "Need it."
    text = ours({"messages": messages, "tools": TOOLS})
    assert "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions" in text


# ------------------------------------------------------------------ parsing

CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris", "days": 3}<|call|>')
OUTPUTS = {  # output -> (reasoning, content, [(name, arguments)])
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hi there.<|return|>": ("Think.", "Hi there.", []),
    # <|return|> and <|call|> are stop tokens: usually not in the text
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hi there.": ("Think.", "Hi there.", []),
    "<|channel|>final<|message|>Just this.": (None, "Just this.", []),
    "<|channel|>analysis<|message|>Need weather.<|end|>" + CALL:
        ("Need weather.", None, [("get_weather", '{"city": "Paris", "days": 3}')]),
    "<|channel|>analysis<|message|>Need weather.<|end|>" + CALL.removesuffix("<|call|>"):
        ("Need weather.", None, [("get_weather", '{"city": "Paris", "days": 3}')]),
    # the recipient in the role part, as the template writes history
    '<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.f'
    '<|channel|>commentary json<|message|>{"a": "é"}<|call|>':
        (None, "Checking.", [("f", '{"a": "é"}')]),
    '<|channel|>commentary to=functions.a<|message|>{}<|call|><|start|>assistant<|channel|>'
    'commentary to=functions.b <|constrain|>json<|message|><|call|>':
        (None, None, [("a", "{}"), ("b", "{}")]),
    # a message with no end marker ends at the next header
    "<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B<|end|>":
        ("A", "B", []),
    "no harmony at all": (None, "no harmony at all", []),
    "<|channel|>analysis<|message|>cut off mid-thou": ("cut off mid-thou", None, []),
    "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin": ("x", None, []),
}
MALFORMED = [  # kept as text: not an object, not JSON, not a function, no name
    '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": <|call|>',
    "<|channel|>commentary to=functions.f<|message|>[1, 2]<|call|>",
    '<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|call|>',
    "<|channel|>commentary to=functions. json<|message|>{}<|call|>",
]


def chat_parsers(with_reasoning: bool = True) -> ChatParsers:
    ids = iter(range(1000))
    return ChatParsers(get_reasoning_parser("harmony") if with_reasoning else None,
                       get_tool_parser("harmony", id_factory=lambda: f"call_{next(ids)}"))


def whole(text: str, with_reasoning: bool = True) -> tuple:
    reasoning, content, calls = chat_parsers(with_reasoning).extract(text)
    return reasoning, content or None, [(c.name, c.arguments) for c in calls]


def streamed(text: str, cuts: list[int], with_reasoning: bool = True) -> tuple:
    stream = chat_parsers(with_reasoning).stream()
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [d for a, b in itertools.pairwise(bounds) for d in stream.feed(text[a:b])]
    deltas += stream.finish()
    reasoning = "".join(d.reasoning_content or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for call in d.tool_calls or ():
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += call.function.name or ""
            entry[1] += call.function.arguments or ""
    entered = stream.reasoning is not None and stream.reasoning.entered_reasoning
    return (reasoning if entered else None), content or None, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("text", list(OUTPUTS))
def test_outputs_whole_and_at_every_split(text: str) -> None:
    expected = OUTPUTS[text]
    assert whole(text) == expected
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == expected, cut
    rng = random.Random(0)
    for _ in range(30):
        cuts = rng.sample(range(len(text) + 1), min(len(text), rng.randint(2, 12)))
        assert streamed(text, cuts) == expected, cuts


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_calls_are_text(text: str) -> None:
    reasoning, content, calls = whole(text)
    assert calls == [] and content == text and reasoning is None
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == (reasoning, content, calls)


def test_without_the_reasoning_parser_calls_are_still_read() -> None:
    """The raw output (``--reasoning-parser`` off): the calls come out, the rest as written."""
    text = "<|channel|>analysis<|message|>Need weather.<|end|>" + CALL
    assert whole(text, with_reasoning=False) == (
        None, "<|channel|>analysis<|message|>Need weather.<|end|>",
        [("get_weather", '{"city": "Paris", "days": 3}')])
    for cut in range(len(text) + 1):
        assert streamed(text, [cut], with_reasoning=False) == whole(text, with_reasoning=False)


PIECES = [*MARKERS, "analysis", "final", "commentary", " to=functions.f", " to=x", " json",
          "{}", '{"a": 1}', "[", "x", " ", "\n", "<|", "|>", "<", "assistant"]


@pytest.mark.parametrize("with_reasoning", [True, False])
def test_any_text_streams_as_whole(with_reasoning: bool) -> None:
    """Random marker soup: never an exception, every split adds up to the whole."""
    rng = random.Random(1)
    for _ in range(300):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        expected = whole(text, with_reasoning)
        cuts = rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6)))
        assert streamed(text, cuts, with_reasoning) == expected, (text, cuts)


def test_the_tool_call_record() -> None:
    parsers = chat_parsers()
    assert parsers.extract(CALL) == (None, None, [ToolCall(
        "call_0", "get_weather", '{"city": "Paris", "days": 3}')])
    assert HarmonyReasoningParser().for_prompt("<|start|>assistant") == HarmonyReasoningParser()
