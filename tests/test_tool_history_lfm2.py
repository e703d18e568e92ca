"""Earlier tool calls written in LFM2's own format (tokenizer/tool_prompt.py) for the LFM2
templates that cannot write calls (LFM2-8B-A1B, LFM2.5-Instruct): the pythonic list between
``<|tool_call_start|>`` and ``<|tool_call_end|>`` the model writes, after the turn's text, read
back by the lfm2 parser; tool results stay in the tool role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixserve.frontend.parsers import get_tool_parser
from radixserve.tokenizer.chat_template import render_chat_template

TEMPLATES = Path(__file__).parent / "chat_templates"
ARGS = {"city": "Paris", "days": 3, "flags": [True, None], "note": 'say "hi"\n', "opts": {}}


def call(name: str, arguments: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_turn(template: str, content: str | None, calls: list[dict]) -> str:
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": content, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "22 C"}]
    text = render_chat_template((TEMPLATES / f"{template}.jinja").read_text(), messages,
                                special_tokens={"bos_token": "<s>"})
    assert "<|im_start|>tool\n" in text  # the result in the tool role, not a user turn
    return text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]


@pytest.mark.parametrize("template", ["LFM2-8B-A1B", "LFM2.5-Instruct"])
def test_calls_in_the_lfm2_format_read_back(template: str) -> None:
    turn = assistant_turn(template, "Let me check.",
                          [call("get_weather", json.dumps(ARGS)), call("get_time", "{}")])
    assert turn.startswith('Let me check.<|tool_call_start|>[get_weather(city="Paris", days=3, ')
    assert turn.endswith("get_time()]<|tool_call_end|>")
    content, calls = get_tool_parser("lfm2").extract(turn)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGS), ("get_time", {})]


def test_arguments_that_are_no_object_are_left_out() -> None:
    """A client replaying a model's broken call: a Python call list has no place for the text,
    so the call is written without arguments, as `chat_template.RawArguments` renders it."""
    turn = assistant_turn("LFM2-8B-A1B", None, [call("get_weather", '{"city": "Par')])
    assert turn == "<|tool_call_start|>[get_weather()]<|tool_call_end|>"


def test_a_template_that_writes_calls_writes_them_itself() -> None:
    """LFM2.5-8B-A1B renders ``tool_calls`` (strings in single quotes): left to it."""
    turn = assistant_turn("LFM2.5-8B-A1B", None,
                          [call("get_weather", json.dumps({"city": "Paris"}))])
    assert turn == "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>"
