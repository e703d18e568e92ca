"""The official ``anthropic`` client against a real ``radixserve serve``: the Messages API.

`TestMockEngine` (no model: the text does not matter) covers the event sequence, auth and
errors; `TestEmbeddedModel` checks greedy equivalence with /v1/chat/completions, stop
sequences and a tool_use → tool_result round trip. Each class starts and stops its own server,
so only one runs at a time.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from server_proc import ServerProc

KEY = "sk-anthropic-test"
ASK = [{"role": "user", "content": "Name three primary colors."}]
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
GREEDY = {"temperature": 0}
TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": WEATHER}]


def _model(url: str, **headers) -> str:
    return httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"]


def _events(client, **kw) -> tuple[list, anthropic.types.Message]:
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def _shape(message) -> list[dict]:
    """A message's content without the random tool-use ids."""
    return [{k: v for k, v in block.model_dump(exclude_none=True).items()
             if k not in ("id", "parsed_output")} for block in message.content]


@pytest.fixture(scope="class")
def mock_server():
    s = ServerProc("--mock-engine", "--api-key", KEY, "--tool-call-parser", "hermes",
                   "--max-request-bytes", str(1 << 20))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="class")
def model_server():
    s = ServerProc("--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0


class TestMockEngine:
    @pytest.fixture
    def server(self, mock_server):
        return mock_server

    @pytest.fixture
    def client(self, server):
        return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)

    @pytest.fixture
    def model(self, server):
        return _model(server.url, authorization=f"Bearer {KEY}")

    def test_create_and_stream(self, client, model):
        kw = dict(model=model, max_tokens=7, system="Be brief.", messages=ASK)
        whole = client.messages.create(**kw)
        assert whole.type == "message" and whole.role == "assistant" and whole.model == model
        assert whole.id.startswith("msg_")
        assert whole.stop_reason == "max_tokens" and whole.stop_sequence is None
        assert [b.type for b in whole.content] == ["text"] and whole.content[0].text
        prompt = client.messages.count_tokens(model=model, system="Be brief.",
                                              messages=ASK).input_tokens
        assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == prompt
        assert whole.usage.output_tokens == 7
        events, final = _events(client, **kw)
        kinds = [e.type for e in events]
        assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
        assert "text" in kinds  # the client's own event for a text delta
        assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 7
        assert final.content[0].text == "".join(e.text for e in events if e.type == "text")

    def test_raw_event_stream_has_ping_and_usage(self, server, model):
        body = {"model": model, "max_tokens": 3, "messages": ASK, "stream": True}
        r = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": KEY})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        pairs = [chunk.split("\n") for chunk in r.text.strip().split("\n\n")]
        names = [p[0].removeprefix("event: ") for p in pairs]
        data = [json.loads(p[1].removeprefix("data: ")) for p in pairs]
        assert names == [d["type"] for d in data]
        assert names[:3] == ["message_start", "ping", "content_block_start"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert data[-2]["usage"]["output_tokens"] == 3
        assert data[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}

    def test_bearer_and_x_api_key_auth(self, server, model):
        bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0)
        assert bearer.messages.create(model=model, max_tokens=2, messages=ASK).content
        for client in (anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0),
                       anthropic.Anthropic(base_url=server.url, auth_token="wrong",
                                           max_retries=0)):
            with pytest.raises(anthropic.AuthenticationError) as err:
                client.messages.create(model=model, max_tokens=2, messages=ASK)
            assert err.value.body == {"type": "error", "error": {
                "type": "authentication_error", "message": "invalid or missing API key"}}
        r = httpx.post(f"{server.url}/v1/messages/count_tokens", json={})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        # the OpenAI routes take the x-api-key header too, and keep their error shape
        chat = {"messages": ASK, "max_tokens": 2}
        ok = httpx.post(f"{server.url}/v1/chat/completions", json=chat,
                        headers={"x-api-key": KEY})
        assert ok.status_code == 200
        refused = httpx.post(f"{server.url}/v1/chat/completions", json=chat)
        assert refused.status_code == 401 and "type" not in refused.json()

    @pytest.mark.parametrize("body, status, kind, words", [
        ({"messages": ASK}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 5, "messages": ASK, "model": "nope"}, 404, "not_found_error", "nope"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "data": ""}}]}]}, 400,
         "invalid_request_error", "image"),
        ({"max_tokens": 5, "messages": ASK, "frequency_penalty": 1}, 400,
         "invalid_request_error", "frequency_penalty"),
        ({"max_tokens": 5, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "tool"}},
         400, "invalid_request_error", "name"),
        ({"max_tokens": 10 ** 6, "messages": ASK}, 400, "invalid_request_error",
         "context length"),
        ({"max_tokens": 5, "messages": ASK, "tools": [{"name": "f", "input_schema": {
            "type": "object", "properties": {"x": {"type": "no-such-type"}}}}],
          "tool_choice": {"type": "tool", "name": "f"}}, 400, "invalid_request_error",
         "tool_choice"),
    ])
    def test_bad_input_answers_in_anthropic_shape(self, server, client, model, body, status,
                                                  kind, words):
        body = {"model": model, **body}
        r = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": KEY})
        assert r.status_code == status, r.text
        error = r.json()
        assert set(error) == {"type", "error"} and error["type"] == "error"
        assert error["error"]["type"] == kind and words in error["error"]["message"], error
        assert client.messages.create(model=model, max_tokens=2, messages=ASK).content

    def test_transport_errors_in_anthropic_shape(self, server):
        headers = {"x-api-key": KEY}
        for r in (httpx.post(f"{server.url}/v1/messages", content=b"{not json",
                             headers=headers),
                  httpx.get(f"{server.url}/v1/messages", headers=headers),
                  httpx.post(f"{server.url}/v1/messages", content=b"x" * (2 << 20),
                             headers=headers)):
            assert 400 <= r.status_code < 500
            assert r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "request_too_large"


class TestEmbeddedModel:
    @pytest.fixture
    def server(self, model_server):
        return model_server

    @pytest.fixture
    def client(self, server):
        return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    @pytest.fixture
    def chat(self, server):
        return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    @pytest.fixture
    def model(self, server):
        return _model(server.url)

    # NOTE: the anthropic client's create() takes no sampling arguments any more (newer Claude
    # models fix them); the API still documents temperature / top_p / top_k, sent here as
    # extra_body.
    def test_greedy_equals_chat_completions(self, client, chat, model):
        for max_tokens in (8, 60):
            ref = chat.chat.completions.create(model=model, messages=ASK, temperature=0,
                                               max_tokens=max_tokens)
            whole = client.messages.create(model=model, messages=ASK, extra_body=GREEDY,
                                           max_tokens=max_tokens)
            assert whole.content[0].text == ref.choices[0].message.content
            expected = {"stop": "end_turn", "length": "max_tokens"}[ref.choices[0].finish_reason]
            assert whole.stop_reason == expected
            usage = whole.usage
            assert usage.input_tokens + usage.cache_read_input_tokens == ref.usage.prompt_tokens
            assert usage.output_tokens == ref.usage.completion_tokens
            _, streamed = _events(client, model=model, messages=ASK, extra_body=GREEDY,
                                  max_tokens=max_tokens)
            assert _shape(streamed) == _shape(whole) and streamed.stop_reason == expected
        assert client.messages.count_tokens(model=model, messages=ASK).input_tokens == \
            ref.usage.prompt_tokens

    def test_stop_sequences(self, client, model):
        kw = dict(model=model, messages=ASK, extra_body=GREEDY, max_tokens=30)
        text = client.messages.create(**kw).content[0].text
        word = text.split()[2]
        cut = client.messages.create(stop_sequences=[word], **kw)
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
        assert cut.content[0].text == text[:text.index(word)]
        _, streamed = _events(client, stop_sequences=[word], **kw)
        assert _shape(streamed) == _shape(cut) and streamed.stop_sequence == word

    def test_tool_use_then_tool_result_round_trip(self, client, chat, model):
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        kw = dict(model=model, tools=TOOLS, extra_body=GREEDY, max_tokens=60)
        for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
            call = client.messages.create(messages=ask, tool_choice=choice, **kw)
            assert call.stop_reason == "tool_use", call
            (block,) = call.content
            assert block.type == "tool_use" and block.name == "get_weather"
            jsonschema.validate(block.input, WEATHER)
            _, streamed = _events(client, messages=ask, tool_choice=choice, **kw)
            assert _shape(streamed) == _shape(call) and streamed.stop_reason == "tool_use"
        turn = ask + [{"role": "assistant", "content": call.content},
                      {"role": "user", "content": [{"type": "tool_result",
                                                    "tool_use_id": block.id,
                                                    "content": "18 degrees and sunny"}]}]
        answer = client.messages.create(messages=turn, tool_choice={"type": "none"}, **kw)
        assert answer.stop_reason in ("end_turn", "max_tokens")
        assert [b.type for b in answer.content] == ["text"]
        # the same conversation through the chat API gives the same answer
        ref = chat.chat.completions.create(
            model=model, temperature=0, max_tokens=60, tool_choice="none",
            tools=[{"type": "function", "function": {"name": "get_weather",
                                                     "description": "The weather in a city",
                                                     "parameters": WEATHER}}],
            messages=ask + [
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": block.id, "type": "function", "function": {
                        "name": "get_weather", "arguments": json.dumps(block.input)}}]},
                {"role": "tool", "tool_call_id": block.id, "content": "18 degrees and sunny"}])
        assert answer.content[0].text == ref.choices[0].message.content

    def test_output_config_format_constrains_the_text(self, client, model):
        kw = dict(model=model, max_tokens=60, extra_body=GREEDY,
                  messages=[{"role": "user", "content": "The weather in Paris, as JSON."}],
                  output_config={"format": {"type": "json_schema", "schema": WEATHER}})
        whole = client.messages.create(**kw)
        jsonschema.validate(json.loads(whole.content[0].text), WEATHER)
        _, streamed = _events(client, **kw)
        assert _shape(streamed) == _shape(whole)
