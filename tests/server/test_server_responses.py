"""POST /v1/responses (and the stored-response routes) through the official openai client,
against a real ``radixserve serve``: the embedded model where the text matters, the mock engine
for the store's persistence and eviction."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_proc import ServerProc

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather",
          "parameters": WEATHER}]
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
GREEDY = dict(temperature=0, max_output_tokens=24)


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _events(client, **kw) -> list:
    return list(client.responses.create(stream=True, **kw))


def _check_sequence(events) -> None:
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type in ("response.completed", "response.incomplete")


def _without_ids(items) -> list[dict]:
    return [{k: v for k, v in item.model_dump(exclude_none=True).items() if k != "id"}
            for item in items]


def test_whole_and_streamed_agree(client):
    kw = dict(input="Name three primary colors.", instructions="Answer briefly.", **GREEDY)
    whole = client.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.output[0].type == "message" and whole.output_text
    assert whole.usage.output_tokens <= 24 and whole.usage.total_tokens == (
        whole.usage.input_tokens + whole.usage.output_tokens)
    events = _events(client, **kw)
    _check_sequence(events)
    types = [e.type for e in events]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text
    assert _without_ids(final.output) == _without_ids(whole.output)
    assert final.status == whole.status  # cached_tokens differ: the second hits the cache
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        whole.usage.input_tokens, whole.usage.output_tokens)


def test_greedy_equals_chat_completions(client):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=client.models.list().data[0].id,
                                          messages=messages, temperature=0, max_tokens=24)
    resp = client.responses.create(instructions="You are terse.",
                                   input="What is the capital of France?", **GREEDY)
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                           else "completed")


def test_previous_response_id_carries_the_conversation(client):
    model = client.models.list().data[0].id
    first = client.responses.create(input="My name is Alice. Say hello.", **GREEDY)
    second = client.responses.create(input="What is my name?",
                                     previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    # the same conversation spelled out to chat completions gives the same greedy answer
    chat = client.chat.completions.create(model=model, temperature=0, max_tokens=24, messages=[
        {"role": "user", "content": "My name is Alice. Say hello."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_tool_round_trip_with_function_call_output(client):
    ask = "What is the weather in Paris, in celsius?"
    kw = dict(tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
              temperature=0, max_output_tokens=60)
    first = client.responses.create(input=ask, **kw)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert calls[0].call_id and first.status == "completed"
    # streamed: the same call, its argument deltas adding up to it
    events = _events(client, input=ask, **kw)
    _check_sequence(events)
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done[0].arguments == calls[0].arguments
    # the tool's answer, through the stored chain and spelled out as items: the same prompt
    output = [{"type": "function_call_output", "call_id": calls[0].call_id,
               "output": '{"temperature": 21, "unit": "celsius"}'}]
    chained = client.responses.create(input=output, previous_response_id=first.id,
                                      tools=TOOLS, **GREEDY)
    spelled = client.responses.create(input=[{"role": "user", "content": ask},
                                             calls[0].model_dump(exclude_none=True), *output],
                                      tools=TOOLS, **GREEDY)
    assert chained.usage.input_tokens == spelled.usage.input_tokens > first.usage.input_tokens
    assert chained.output_text == spelled.output_text
    assert chained.output[0].type == "message"


def test_text_format_json_schema(client):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON}}
    whole = client.responses.create(input="Describe a person as JSON.", text=fmt,
                                    temperature=0, max_output_tokens=80)
    jsonschema.validate(json.loads(whole.output_text), PERSON)
    assert whole.text.format.type == "json_schema"
    events = _events(client, input="Describe a person as JSON.", text=fmt, temperature=0,
                     max_output_tokens=80)
    assert events[-1].response.output_text == whole.output_text
    obj = client.responses.create(input="Describe a person as JSON.",
                                  text={"format": {"type": "json_object"}}, temperature=0,
                                  max_output_tokens=40)
    # any object: left free it runs past 40 tokens; the wind-down closes it within them
    # (structured/wind_down.py), so it completes as an object
    assert obj.status == "completed", obj.output_text
    assert isinstance(json.loads(obj.output_text), dict)


def test_get_delete_and_input_items(client):
    resp = client.responses.create(input=[{"role": "user", "content": "one"},
                                          {"role": "user", "content": "two"}],
                                   metadata={"run": "7"}, max_output_tokens=4)
    got = client.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text
    assert got.metadata == {"run": "7"}
    items = client.responses.input_items.list(resp.id)
    assert [i.content[0].text for i in items.data] == ["two", "one"]  # newest first
    asc = client.responses.input_items.list(resp.id, order="asc", limit=1)
    assert [i.content[0].text for i in asc.data] == ["one"] and asc.has_more
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(resp.id)
    unstored = client.responses.create(input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),  # the served model takes text only
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
     "input.0.content"),
    ({"input": [{"type": "web_search_call"}]}, "input.0"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, "temperature"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ({"input": []}, "input"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"type": "bogus"}}}}, "text.format"),
])
def test_bad_input_is_a_400_in_openai_shape(server, body, param):
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert httpx.post(f"{server.url}/v1/responses", json={"input": "hi",
                                                          "max_output_tokens": 1},
                      timeout=30).status_code == 200


def test_unknown_previous_response_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(input="hi", previous_response_id="resp_missing")
    assert info.value.body["param"] == "previous_response_id"
    assert info.value.body["code"] == "previous_response_not_found"


def test_the_store_survives_a_restart_and_evicts_the_oldest(tmp_path):
    args = ("--mock-engine", "--response-store", str(tmp_path / "responses.db"),
            "--response-store-max", "3")
    s = ServerProc(*args)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        made = [client.responses.create(input=f"turn {i}", max_output_tokens=3)
                for i in range(4)]
    finally:
        assert s.stop() == 0
    s = ServerProc(*args)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made[0].id)  # evicted: the store keeps 3
        for resp in made[1:]:
            assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
        nxt = client.responses.create(input="again", previous_response_id=made[3].id,
                                      max_output_tokens=3)
        assert nxt.usage.input_tokens > made[3].usage.input_tokens
    finally:
        assert s.stop() == 0
