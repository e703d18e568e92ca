"""gpt-oss's harmony format through ``/v1/chat/completions`` on a real server.

A tiny random model whose tokenizer carries gpt-oss's chat template, started with
``--reasoning-parser auto`` (the template's ``harmony``; tool calls auto-detected as
``harmony`` too). Its output is fixed by a regex constraint from the first token
(``after_reasoning: false``), written as gpt-oss writes it: an analysis message, then a final
answer or a call. Whole and streamed, the analysis is ``reasoning_content`` and the answer
``content``, or the call is ``tool_calls``; a second turn sends the call back with its
reasoning and its result, at ``reasoning_effort`` high, and the template renders all three.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model

TEMPLATE = (Path(__file__).parents[1] / "chat_templates" / "openai-gpt-oss-120b.jinja"
            ).read_text()
ANSWER = ("<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>final"
          "<|message|>Done.")
CALL = ('<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary '
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_hf_model("qwen2", tmp_path_factory.mktemp("gpt_oss") / "m", seed=3)
    for name, extra in (("tokenizer_config.json", {"chat_template": TEMPLATE}),
                        ("config.json", {"max_position_embeddings": 2048})):  # the long system
        config = json.loads((path / name).read_text())
        (path / name).write_text(json.dumps({**config, **extra}))
    s = ServerProc("--model", str(path), "--num-kv-blocks", "256", "--reasoning-parser", "auto",
                   timeout=120)
    s.startup_line = next(line for line in s.proc.stdout if "radixserve: serving" in line)
    yield s
    assert s.stop() == 0


def _body(output: str, stream: bool, **extra) -> dict:
    return {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 200,
            "stream": stream, "structured_outputs": {
                "regex": re.escape(output), "after_reasoning": False}, **extra}


def _whole(server, body: dict) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or ()]
    return {"reasoning": message.get("reasoning_content"), "content": message["content"],
            "calls": calls, "finish": choice["finish_reason"]}


def _streamed(server, body: dict) -> dict:
    reasoning, content, calls, finish = [], [], {}, None
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                reasoning.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or ():
                    entry = calls.setdefault(call["index"], ["", ""])
                    entry[0] += call["function"].get("name") or ""
                    entry[1] += call["function"].get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    return {"reasoning": "".join(reasoning) or None, "content": "".join(content) or None,
            "calls": [tuple(c) for c in calls.values()], "finish": finish}


def test_the_template_is_detected(server):
    assert "reasoning: harmony; tool calls: harmony)" in server.startup_line


@pytest.mark.parametrize("read", [_whole, _streamed])
def test_analysis_is_reasoning_and_final_is_content(server, read):
    assert read(server, _body(ANSWER, read is _streamed)) == {
        "reasoning": "Plan.", "content": "Done.", "calls": [], "finish": "stop"}


@pytest.mark.parametrize("read", [_whole, _streamed])
def test_a_commentary_call_is_a_tool_call(server, read):
    assert read(server, _body(CALL, read is _streamed, tools=TOOLS)) == {
        "reasoning": "Plan.", "content": None, "calls": [("get_weather", '{"city": "Paris"}')],
        "finish": "tool_calls"}


def test_the_tool_loop_goes_on_with_its_reasoning(server):
    history = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "Plan.",
                      "tool_calls": [{"id": "c1", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "22 C"}]
    body = {**_body(ANSWER, False, tools=TOOLS), "messages": history,
            "reasoning_effort": "high"}
    r = httpx.post(f"{server.url}/v1/chat/completions/render", json=body, timeout=60)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "Reasoning: high" in prompt
    assert ('<|start|>assistant<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant '
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary'
            '<|message|>"22 C"<|end|><|start|>assistant') in prompt
    assert _whole(server, body) == {"reasoning": "Plan.", "content": "Done.", "calls": [],
                                    "finish": "stop"}
