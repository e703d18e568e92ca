"""The chat templates of the families users run in 2026, as released (tests/chat_templates/,
copied from llama.cpp's models/templates with their names): Qwen3.5, LFM2 / LFM2.5, Granite
4.0 / 4.1, Nemotron 3 Nano and Nano v2, SmolLM3, GLM-4.7-Flash, Ministral 3.

For each: the template renders a system prompt, tools, an assistant's tool call and its result
and a second turn, with thinking on and off, as transformers renders it (the OpenAI form of the
call, arguments as a JSON string, against transformers' documented dict form); the tool-call
format and reasoning parser detected from it read outputs written the way the template shows
the model writing them, streamed in any split as whole; a malformed call is text, in the output,
and renders, in the history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from radixserve.frontend.parsers import (
    ReasoningParser,
    ToolCallDelta,
    ToolCallParser,
    get_reasoning_parser,
    get_tool_parser,
)
from radixserve.frontend.parsers.detect import detect_reasoning_parser, detect_tool_format
from radixserve.tokenizer.chat_template import render_chat_template

TEMPLATES = Path(__file__).parent / "chat_templates"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]
ARGS = {"city": "Paris", "days": 3}
RESULT = "22 C, sunny"
CALL_ID = "abcDEF123"  # Mistral's templates take 9 letters and digits only


@dataclass(frozen=True)
class Family:
    template: str
    tool_format: str
    reasoning: str | None  # the detected reasoning parser
    thinking_off: dict[str, Any] | str | None  # template kwargs, or a flag in the system prompt
    renders_calls: bool = True  # renders tools, calls and results itself (else tool_prompt.py)

    @property
    def source(self) -> str:
        return (TEMPLATES / f"{self.template}.jinja").read_text()


FAMILIES = {
    "qwen3.5": Family("Qwen3.5-4B", "qwen3_coder", "think", {"enable_thinking": False}),
    "lfm2": Family("LFM2-8B-A1B", "lfm2", None, None, renders_calls=False),
    "lfm2.5-instruct": Family("LFM2.5-Instruct", "lfm2", "think", None, renders_calls=False),
    "lfm2.5": Family("LFM2.5-8B-A1B", "lfm2", "think", None),
    "granite-4.0": Family("ibm-granite-granite-4.0", "hermes", None, None),
    "granite-4.1": Family("ibm-granite-granite-4.1", "hermes", None, None),
    "nemotron-3-nano": Family("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "qwen3_coder", "think",
                              {"enable_thinking": False}),
    "nemotron-nano-v2": Family("NVIDIA-Nemotron-Nano-v2", "nemotron_v2", "think", "/no_think"),
    "smollm3": Family("HuggingFaceTB-SmolLM3-3B", "hermes", "think",
                      {"enable_thinking": False}, renders_calls=False),
    "glm-4.7": Family("GLM-4.7-Flash", "glm45", "think", {"enable_thinking": False}),
    "ministral-3": Family("mistralai-Ministral-3-14B-Reasoning-2512", "mistral", "mistral", None),
}
STATES = [(name, thinking) for name, f in FAMILIES.items()
          for thinking in ((True, False) if f.thinking_off is not None else (True,))]


def conversation(system: str, *, openai: bool, arguments: str | None = None,
                 calls: bool = True) -> list[dict[str, Any]]:
    """A tool round trip and a second question. ``openai``: the call as an OpenAI client sends
    it (content null, arguments a JSON string: `arguments` if given), else as transformers
    documents it (no content key, arguments a dict)."""
    fn = {"name": "get_weather",
          "arguments": (arguments or json.dumps(ARGS)) if openai else ARGS}
    call = {"role": "assistant", "tool_calls": [{"id": CALL_ID, "type": "function",
                                                 "function": fn}]}
    if openai:
        call["content"] = None
    loop = [call, {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT}] if calls else []
    return [{"role": "system", "content": system},
            {"role": "user", "content": "Weather in Paris for 3 days?"}, *loop,
            {"role": "assistant", "content": "It is 22 C in Paris."},
            {"role": "user", "content": "And in Rome?"}]


def switch(family: Family, thinking: bool) -> tuple[str, dict[str, Any]]:
    """(system prompt, template kwargs) for thinking on or off."""
    off = family.thinking_off
    if thinking or off is None:
        return "You are terse.", {}
    return ("You are terse. " + off, {}) if isinstance(off, str) else ("You are terse.", off)


def ours(family: Family, messages: list[dict], tools: list | None = TOOLS, **kwargs: Any) -> str:
    return render_chat_template(family.source, messages, tools=tools, add_generation_prompt=True,
                                special_tokens=SPECIAL, **kwargs)


def transformers_render(family: Family, messages: list[dict], tools: list | None = TOOLS,
                        **kwargs: Any) -> str:
    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=family.source,
                                        add_generation_prompt=True, **SPECIAL, **kwargs)
    return rendered[0]


# ------------------------------------------------------------------ rendering


@pytest.mark.parametrize(("name", "thinking"), STATES)
def test_renders_as_transformers(name: str, thinking: bool) -> None:
    family = FAMILIES[name]
    system, kwargs = switch(family, thinking)
    calls = family.renders_calls  # else rendered in the generic format: the next test
    tools = None if name == "smollm3" else TOOLS  # SmolLM3's template drops tools: ditto
    text = ours(family, conversation(system, openai=True, calls=calls), tools, **kwargs)
    assert text == transformers_render(
        family, conversation(system, openai=False, calls=calls), tools, **kwargs)
    assert "And in Rome?" in text and "It is 22 C in Paris." in text
    if calls:
        assert "get_weather" in text.split("Weather in Paris for 3 days?")[1]  # the call
        assert RESULT in text


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if not f.renders_calls])
def test_templates_without_calls_get_the_loop_written_in(name: str) -> None:
    """transformers drops (or fails on) what these templates cannot render; radixserve writes
    it in (tokenizer/tool_prompt.py): the definitions, the call in the format the template
    shows (LFM2's call list for LFM2 and LFM2.5-Instruct, which the lfm2 parser reads back)
    or else the generic one (Hermes), its result (in the tool role where the model has one)."""
    family = FAMILIES[name]
    text = ours(family, conversation("You are terse.", openai=True))
    assert text.count("get_weather") == 2  # the definition and the earlier call
    call = text.split("Weather in Paris for 3 days?")[1].split("<|im_start|>assistant\n")[1]
    call = call.split("<|im_end|>")[0]
    _, calls = get_tool_parser(family.tool_format).extract(call)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
    lfm2 = family.tool_format == "lfm2"
    assert call.startswith("<|tool_call_start|>[get_weather(") == lfm2
    assert RESULT in text and text.index(RESULT) < text.index("And in Rome?")
    assert ("<|im_start|>tool\n" in text) == lfm2  # else a user turn of <tool_response>


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("arguments", ['{"city": "Par', "Paris", "[1, 2]"])
def test_a_malformed_call_in_the_history_renders(name: str, arguments: str) -> None:
    """Arguments that are not a JSON object (a client replaying a model's broken call) render:
    as the text where the template writes text, as a call without arguments where it iterates
    them (`chat_template.RawArguments`)."""
    family = FAMILIES[name]
    text = ours(family, conversation("You are terse.", openai=True, arguments=arguments))
    assert "get_weather" in text.split("Weather in Paris for 3 days?")[1]
    assert text.count(RESULT) == 1


def test_qwen35_string_arguments() -> None:
    """The released Qwen3.5 template iterates ``arguments|items``, which fails where arguments
    arrive as the OpenAI string (transformers as llama.cpp: ggml-org/llama.cpp#19905); the
    string reaches it here as the object, and a malformed one as a call without arguments."""
    family = FAMILIES["qwen3.5"]
    openai = conversation("s", openai=True)
    with pytest.raises(TypeError, match="mapping"):
        transformers_render(family, openai)
    assert ours(family, openai) == transformers_render(family, conversation("s", openai=False))
    text = ours(family, conversation("s", openai=True, arguments="{oops"))
    assert "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>" in text


# ------------------------------------------------------------------ detection


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_detected_parsers(name: str) -> None:
    family = FAMILIES[name]
    assert detect_tool_format(family.source) == family.tool_format
    assert detect_reasoning_parser(family.source) == family.reasoning


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_prompt_decides_where_the_output_starts(name: str) -> None:
    """Qwen3.5, Nemotron and GLM-4.7 open the think block in the prompt when thinking is on
    (the output starts inside it) and close an empty one when it is off; the others' models
    write their own start tag."""
    family = FAMILIES[name]
    opens = name in ("qwen3.5", "nemotron-3-nano", "nemotron-nano-v2", "glm-4.7")
    reasoning, _ = parsers(family, thinking=True)
    assert (reasoning is not None and reasoning.starts_in_reasoning) == opens
    if family.thinking_off is not None:
        reasoning, _ = parsers(family, thinking=False)
        assert reasoning is not None and not reasoning.starts_in_reasoning


def test_for_prompt_reads_the_block_the_template_opened() -> None:
    think = get_reasoning_parser("think")
    assert think.for_prompt("<|im_start|>assistant\n<think>\n").starts_in_reasoning
    assert think.for_prompt("x<think>\n\n</think>\n\n") is think
    r1 = get_reasoning_parser("deepseek_r1")
    assert not r1.for_prompt("<｜Assistant｜><think>\n\n</think>").starts_in_reasoning
    assert r1.for_prompt("<｜Assistant｜>") is r1  # neither: the preset stands
    assert get_reasoning_parser("mistral").for_prompt("[THINK]") == ReasoningParser(
        "[THINK]", "[/THINK]", starts_in_reasoning=True)


# ------------------------------------------------------------------ outputs

QWEN_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
PARIS3 = [("get_weather", '{"city": "Paris", "days": 3}')]
PARIS = [("get_weather", '{"city": "Paris"}')]
LFM_CALL = '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>'
NEMO_CALL = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>'
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GLM_CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
BAD = object()  # content: the whole output after the reasoning, as it is

# family -> [(thinking, output, reasoning, content, calls)]; outputs written as each template
# shows its model writing them (tool instruction, history rendering), after the prompt it ends
OUTPUTS: dict[str, list[tuple[bool, str, str | None, object, list]]] = {
    "qwen3.5": [
        (True, "The user wants 3 days of weather.\n</think>\n\n" + QWEN_CALL,
         "The user wants 3 days of weather.", None, PARIS3),
        (True, "Easy.\n</think>\n\nIt is 22 C in Paris.", "Easy.", "It is 22 C in Paris.", []),
        (False, "I'll check.\n\n" + QWEN_CALL, None, "I'll check.", PARIS3),
        (True, ("Hmm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
         "Paris\n</function>\n</tool_call>"), "Hmm.", BAD, []),
    ],
    "lfm2": [
        (True, LFM_CALL + "Checking the weather in Paris.", None,
         "Checking the weather in Paris.", PARIS3),
        (True, "<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>", None, BAD, []),
    ],
    "lfm2.5-instruct": [
        (True, "<|tool_call_start|>[get_weather(city='Paris', days=3)]<|tool_call_end|>", None,
         None, PARIS3),
    ],
    "lfm2.5": [
        (True, "<think>I need the weather tool.</think>" + LFM_CALL, "I need the weather tool.",
         None, PARIS3),
        (True, ("<think>Two cities.</think>Let me check.<|tool_call_start|>[get_weather(city="
         '"Paris"), get_weather(city="Rome", days=null)]<|tool_call_end|>'), "Two cities.",
         "Let me check.", [*PARIS, ("get_weather", '{"city": "Rome", "days": null}')]),
        (True, "<|tool_call_start|>[get_weather(city=\"Paris\"]<|tool_call_end|>", None, BAD, []),
    ],
    "granite-4.0": [
        (True, HERMES_CALL, None, None, PARIS),
        (True, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
         None, BAD, []),
    ],
    "granite-4.1": [(True, "Sure.\n" + HERMES_CALL, None, "Sure.", PARIS)],
    "nemotron-3-nano": [
        (True, "The user asks for the weather.\n</think>\n" + QWEN_CALL + "\n",
         "The user asks for the weather.", None, PARIS3),
        (False, "It is sunny in Paris.", None, "It is sunny in Paris.", []),
        (True, "Let me see.\n</think>\n<tool_call>\n<function=get_weather>\n</tool_call>",
         "Let me see.", BAD, []),
    ],
    "nemotron-nano-v2": [
        (True, "I'm\nthinking\n</think>\n" + NEMO_CALL, "I'm\nthinking", None, PARIS),
        (False, NEMO_CALL + "\n", None, None, PARIS),
        (False, '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": }}]</TOOLCALL>',
         None, BAD, []),
    ],
    "smollm3": [
        (True, "<think>\nThe user wants the weather.\n</think>\n" + HERMES_CALL,
         "The user wants the weather.", None, PARIS),
        (False, "It is 22 C.", None, "It is 22 C.", []),
    ],
    "glm-4.7": [
        (True, "The user wants Paris weather.</think>" + GLM_CALL,
         "The user wants Paris weather.", None, PARIS3),
        (False, ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
         "</tool_call>"), None, None, PARIS),
        (False, ("Sure.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
         "</tool_call>"), None, BAD, []),
    ],
    "ministral-3": [
        (True, ('[THINK]The user wants the weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": '
         '"Paris", "days": 3}'), "The user wants the weather.", None, PARIS3),
        (True, "[THINK]Simple.[/THINK]Hello!", "Simple.", "Hello!", []),
        (True, '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', None, BAD, []),
    ],
}
CASES = [(name, *case) for name, cases in OUTPUTS.items() for case in cases]


def parsers(family: Family, thinking: bool) -> tuple[ReasoningParser | None, ToolCallParser]:
    """The detected parsers, the reasoning one set for the prompt the template renders."""
    system, kwargs = switch(family, thinking)
    prompt = ours(family, conversation(system, openai=True)[:2], **kwargs)
    name = detect_reasoning_parser(family.source)
    reasoning = get_reasoning_parser(name).for_prompt(prompt) if name else None
    return reasoning, get_tool_parser(detect_tool_format(family.source))


def whole(reasoning: ReasoningParser | None, tools: ToolCallParser, text: str):
    thought, content = reasoning.extract(text) if reasoning else (None, text)
    content, calls = tools.extract(content)
    return thought, content, [(c.name, c.arguments) for c in calls]


def streamed(reasoning: ReasoningParser | None, tools: ToolCallParser, chunks: list[str]):
    """Reasoning first, then tool calls on the content, as the server chains them."""
    r_stream, t_stream = reasoning.new_stream() if reasoning else None, tools.new_stream()
    thought, content, calls = [], [], []

    def tool_deltas(items: list) -> None:
        for item in items:
            if isinstance(item, ToolCallDelta):
                if item.id is not None:
                    calls.append([item.name, ""])
                calls[-1][1] += item.arguments_delta
            else:
                content.append(item)

    for chunk in chunks:
        part = chunk
        if r_stream:
            r, part = r_stream.feed(chunk)
            thought.append(r)
        tool_deltas(t_stream.feed(part))
    if r_stream:
        r, part = r_stream.finish()
        thought.append(r)
        tool_deltas(t_stream.feed(part))
    tool_deltas(t_stream.finish())
    entered = r_stream is not None and r_stream.entered_reasoning
    return "".join(thought) if entered else None, "".join(content) or None, [
        tuple(call) for call in calls]


@pytest.mark.parametrize(("name", "thinking", "text", "thought", "content", "calls"), CASES)
def test_outputs(name: str, thinking: bool, text: str, thought: str | None, content: object,
                 calls: list) -> None:
    reasoning, tools = parsers(FAMILIES[name], thinking)
    expected = whole(reasoning, tools, text)
    after = text.split(reasoning.end_tag)[-1].lstrip() if thought is not None else text
    assert expected == (thought, after if content is BAD else content, calls)
    for cut in range(len(text) + 1):  # every chunk boundary, and a token a character
        assert streamed(reasoning, tools, [text[:cut], text[cut:]]) == expected, cut
    assert streamed(reasoning, tools, list(text)) == expected


def test_every_family_has_outputs() -> None:
    assert set(OUTPUTS) == set(FAMILIES)
    assert {(n, t) for n, t, *_ in CASES} >= set(STATES)
