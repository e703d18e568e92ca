"""Tool calling through any chat template (tokenizer/tool_prompt.py): an agent's round trip —
tools, an assistant turn that only calls tools (content null or absent), the tool results —
renders on the embedded SmolLM2 template (no tool support), a template with Gemma's strict
role alternation and a template that handles tools itself (as given)."""

from __future__ import annotations

import json

import pytest

from radixserve.frontend.parsers import get_tool_parser
from radixserve.models.source import ModelSource
from radixserve.tokenizer.chat_template import render_chat_template
from radixserve.tokenizer.tokenizer import load_tokenizer
from radixserve.tokenizer.tool_prompt import adapt_tools

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}


def _loop(content="absent"):
    assistant = {"role": "assistant", "tool_calls": [CALL, {**CALL, "id": "call_2"}]}
    if content != "absent":
        assistant["content"] = content
    return [{"role": "user", "content": "Weather in Paris?"}, assistant,
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}]


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer(ModelSource.resolve(None))


@pytest.mark.parametrize("content", ["absent", None, ""])
def test_a_template_without_tool_support_gets_the_generic_format(smollm2, content):
    text = smollm2.apply_chat_template(_loop(content), tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou may call one or more functions")
    assert '"name": "get_weather"' in text and '"required": ["city"]' in text  # definitions
    calls = get_tool_parser("hermes").extract(
        text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0])[1]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})] * 2  # the history's calls, as the parser reads them
    results = text.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
    assert results == ("<tool_response>\n22 C\n</tool_response>\n"
                       "<tool_response>\nsunny\n</tool_response>")  # one user turn
    assert text.endswith("<|im_start|>assistant\n")


def test_an_existing_system_message_keeps_its_text(smollm2):
    messages = [{"role": "system", "content": "Be brief."}, *_loop()]
    text = smollm2.apply_chat_template(messages, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou may call")
    assert text.count("<|im_start|>system") == 1


def test_without_tools_nothing_changes(smollm2):
    messages = [{"role": "user", "content": "Hi"}]
    assert adapt_tools(smollm2.chat_template, messages, None) == (messages, None)


ALTERNATING = (  # Gemma's rule: a system turn folds into the first user turn, then user and
    # model alternate strictly (written for this test; no tool support)
    "{% if messages[0].role == 'system' %}{% set first = messages[0].content + '\n\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}"
    "{% endif %}{% for m in rest %}"
    "{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "<start>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{{ first if loop.first else '' }}{{ m.content }}<end>\n{% endfor %}")


def test_alternating_roles_accept_the_round_trip():
    text = render_chat_template(ALTERNATING, _loop(None), tools=TOOLS)
    assert text.startswith("<start>user\nYou may call one or more functions")
    assert text.count("<tool_call>\n{") == 1 + 2  # the instructions' example, the two calls
    assert text.count("<start>") == 3
    assert text.endswith("<tool_response>\n22 C\n</tool_response>\n"
                         "<tool_response>\nsunny\n</tool_response><end>\n")


TOOL_AWARE = (  # reads tools, tool_calls and the tool role (as Qwen2.5's and Hermes' do)
    "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}RESULT:{{ m.content }}\n"
    "{% elif m.tool_calls %}CALLS:{{ m.tool_calls | length }}:{{ m.content }}\n"
    "{% else %}{{ m.role }}:{{ m.content }}\n{% endif %}{% endfor %}")


def test_a_template_with_tool_support_renders_the_conversation_as_given():
    text = render_chat_template(TOOL_AWARE, _loop(None), tools=TOOLS)
    assert text == (f"TOOLS:{json.dumps(TOOLS)}\nuser:Weather in Paris?\nCALLS:2:\n"
                    "RESULT:22 C\nRESULT:sunny\n")
