"""OpenAI protocol models: request parsing and rejection, SamplingParams mapping, error bodies,
and the exact JSON shape of responses."""

from __future__ import annotations

import json
import re

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import ValidationError

from radixserve.frontend.openai.protocol_chat import (ChatCompletionChoice, ChatCompletionMessage,
                                                      ChatCompletionRequest, ChatCompletionResponse,
                                                      ChatCompletionStreamChoice,
                                                      ChatCompletionStreamResponse, ChatLogprobs,
                                                      ChatTokenLogprob, ChatTopLogprob,
                                                      DeltaFunctionCall, DeltaMessage,
                                                      DeltaToolCall, DetokenizeRequest,
                                                      FunctionCall, TokenizeRequest, ToolCall)
from radixserve.frontend.openai.protocol import (CompletionLogprobs, CompletionRequest,
                                                 CompletionResponse, CompletionResponseChoice,
                                                 CompletionStreamResponse, ModelCard, ModelList,
                                                 PromptTokensDetails, UsageInfo, random_id)
from radixserve.frontend.http.protocol_base import (ErrorInfo, ErrorResponse, ParamError,
                                                    error_body, validation_error_body,
                                                    value_error_body)

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "hello", **fields})


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def rejected(build, **fields) -> dict:
    """The OpenAI error body of a request that must fail validation."""
    with pytest.raises(ValidationError) as info:
        build(**fields)
    return validation_error_body(info.value)["error"]


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_completion_prompt_forms(prompt):
    assert CompletionRequest(prompt=prompt).prompt == prompt


@pytest.mark.parametrize("prompt", [[], [[]], [1, "a"], [-1], [[1], "a"], 5, None])
def test_completion_bad_prompt(prompt):
    error = rejected(completion, prompt=prompt)
    assert error["param"] == "prompt"


def test_minimal_requests_defaults():
    request = CompletionRequest(prompt="hi")
    assert (request.model, request.max_tokens, request.n, request.stream) == (None, 16, 1, False)
    assert request.priority == 0
    request = ChatCompletionRequest(messages=USER, model="m")
    assert request.model == "m" and request.max_tokens is None
    assert request.add_generation_prompt and not request.continue_final_message


def test_chat_message_forms():
    request = chat(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]},
        {"role": "user", "content": "weather?", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ], tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low")
    assert [m.text() for m in request.messages] == ["be brief", "a\nb", "weather?", None, "sunny"]
    assert request.messages[3].tool_calls[0].function.name == "get_weather"
    for choice in ("none", "auto", "required"):
        assert chat(tools=[TOOL], tool_choice=choice).tool_choice == choice


@pytest.mark.parametrize("build,field", [
    (completion, "foo"), (completion, "functions"), (chat, "prompt_logprobs"),
    (chat, "foo"), (chat, "functions"), (chat, "echo"), (chat, "suffix"), (chat, "best_of"),
])
def test_unknown_parameter_is_named(build, field):
    error = rejected(build, **{field: 1})
    assert error == {"message": f"Unsupported parameter: '{field}'",
                     "type": "invalid_request_error", "param": field, "code": None}


def test_nested_unknown_parameters_are_named():
    assert rejected(chat, messages=[{"role": "user", "content": "x", "foo": 1}])["param"] == \
        "messages.0.foo"
    assert rejected(completion, stream=True, stream_options={"foo": True})["param"] == \
        "stream_options.foo"


def test_unsupported_values():
    assert rejected(completion, suffix="tail", echo=True) == error_body(
        "suffix cannot be combined with echo", param="suffix")["error"]
    assert rejected(completion, best_of=3)["param"] == "best_of"
    assert completion(n=2, best_of=2).best_of == 2
    audio = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
    error = rejected(chat, messages=[{"role": "user", "content": [audio]}])
    assert error["param"] == "messages.0.content"
    assert "unsupported content part type 'input_audio'" in error["message"]
    assert rejected(chat, stream_options={"include_usage": True})["param"] == "stream_options"
    assert chat(stream=True, stream_options={"include_usage": True}).stream_options.include_usage


@pytest.mark.parametrize("fields,param", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages.0"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop": 5}, "stop"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"continue_final_message": True}, "continue_final_message"),
])
def test_chat_rejections_name_the_parameter(fields, param):
    error = rejected(chat, **fields)
    assert error["param"] == param
    assert param.split(".")[-1] in error["message"] or "messages" in param
    assert "Value error" not in error["message"]


def test_completion_logprobs_range():
    assert rejected(completion, logprobs=21)["param"] == "logprobs"
    assert completion(logprobs=0).logprobs == 0


# ----------------------------------------------------------------------------- SamplingParams


def test_completion_to_sampling_params():
    params = completion(
        max_tokens=None, temperature=0, top_p=0.9, n=2, stop="END", seed=7,
        presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={"5": -100, " 7 ": 2.5},
        logprobs=3, top_k=40, min_p=0.1, repetition_penalty=1.2, stop_token_ids=[2],
        ignore_eos=True, min_tokens=1, skip_special_tokens=False,
        include_stop_str_in_output=True, priority=-3, user="u",
    ).to_sampling_params(default_max_tokens=99)
    assert (params.max_tokens, params.temperature, params.top_p, params.n) == (99, 0.0, 0.9, 2)
    assert params.stop == ["END"] and params.seed == 7
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.logit_bias == {5: -100.0, 7: 2.5} and params.logprobs == 3
    assert (params.top_k, params.min_p, params.repetition_penalty) == (40, 0.1, 1.2)
    assert params.stop_token_ids == [2] and params.ignore_eos and params.min_tokens == 1
    assert not params.skip_special_tokens and params.include_stop_str_in_output
    assert not hasattr(params, "priority")


def test_defaults_map_to_openai_defaults():
    params = chat(temperature=None, top_p=None, n=None, stop=None).to_sampling_params(50)
    assert (params.temperature, params.top_p, params.n, params.top_k) == (1.0, 1.0, 1, -1)
    assert (params.max_tokens, params.stop, params.logprobs, params.logit_bias) == \
        (50, [], None, None)
    assert completion().to_sampling_params(50).max_tokens == 16
    assert completion(stop=["a", "b"]).to_sampling_params(50).stop == ["a", "b"]
    assert chat(priority=5).priority == 5


def test_max_completion_tokens_wins():
    assert chat(max_tokens=10).to_sampling_params(99).max_tokens == 10
    assert chat(max_completion_tokens=20).to_sampling_params(99).max_tokens == 20
    assert chat(max_tokens=10, max_completion_tokens=20).to_sampling_params(99).max_tokens == 20


def test_chat_logprobs_mapping():
    assert chat().to_sampling_params(8).logprobs is None
    assert chat(logprobs=False).to_sampling_params(8).logprobs is None
    assert chat(logprobs=True).to_sampling_params(8).logprobs == 0
    assert chat(logprobs=True, top_logprobs=5).to_sampling_params(8).logprobs == 5
    with pytest.raises(ParamError, match="top_logprobs") as info:
        chat(logprobs=True, top_logprobs=5).to_sampling_params(8, max_logprobs=4)
    assert value_error_body(info.value)["error"]["param"] == "top_logprobs"


@pytest.mark.parametrize("key", ["abc", "-1", "1.5", ""])
def test_bad_logit_bias_key(key):
    with pytest.raises(ValueError, match="logit_bias") as info:
        completion(logit_bias={key: 1.0}).to_sampling_params(8)
    assert value_error_body(info.value)["error"]["param"] == "logit_bias"


@pytest.mark.parametrize("fields,param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"),
    ({"max_tokens": -1}, "max_tokens"), ({"logit_bias": {"1": 500}}, "logit_bias"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
])
def test_sampling_params_errors_propagate_and_name_the_parameter(fields, param):
    with pytest.raises(ValueError, match=f"SamplingParams.{param}") as info:
        completion(**fields).to_sampling_params(8)
    error = value_error_body(info.value)["error"]
    assert error["param"] == param and error["message"].startswith(param)


# ----------------------------------------------------------------------------- tokenize


def test_tokenize_requests():
    assert TokenizeRequest(prompt="hi").effective_add_special_tokens
    chat_form = TokenizeRequest(messages=USER, add_generation_prompt=False)
    assert not chat_form.effective_add_special_tokens
    assert TokenizeRequest(prompt="hi", add_special_tokens=False).effective_add_special_tokens \
        is False
    for bad in ({}, {"prompt": "hi", "messages": USER}, {"prompt": "hi", "foo": 1}):
        with pytest.raises(ValidationError):
            TokenizeRequest.model_validate(bad)
    assert DetokenizeRequest(tokens=[1, 2]).tokens == [1, 2]
    with pytest.raises(ValidationError) as info:
        DetokenizeRequest(tokens=[-1])
    assert validation_error_body(info.value)["error"]["param"] == "tokens.0"


# ----------------------------------------------------------------------------- responses


def dumped(model) -> dict:
    return json.loads(model.model_dump_json())


def test_completion_response_shape():
    usage = UsageInfo(prompt_tokens=3, completion_tokens=2, total_tokens=5,
                      prompt_tokens_details=PromptTokensDetails(cached_tokens=1))
    logprobs = CompletionLogprobs(tokens=["a"], token_logprobs=[-0.1],
                                  top_logprobs=[{"a": -0.1}], text_offset=[0])
    response = CompletionResponse(model="m", choices=[CompletionResponseChoice(
        index=0, text="ab", logprobs=logprobs, finish_reason="length")], usage=usage)
    body = dumped(response)
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", body.pop("id"))
    assert isinstance(body.pop("created"), int)
    assert body == {"object": "text_completion", "model": "m", "choices": [{
        "index": 0, "text": "ab", "finish_reason": "length", "stop_reason": None,
        "logprobs": {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1}],
                     "text_offset": [0]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                  "prompt_tokens_details": {"cached_tokens": 1}}}
    chunk = dumped(CompletionStreamResponse(id="cmpl-1", created=1, model="m", choices=[
        CompletionResponseChoice(index=0, text="a")]))
    assert chunk == {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "text": "a", "logprobs": None,
                                  "finish_reason": None, "stop_reason": None}]}


def test_chat_response_shape():
    top = ChatTopLogprob(token="hi", logprob=-0.5, bytes=[104, 105])
    message = ChatCompletionMessage(tool_calls=[ToolCall(
        function=FunctionCall(name="f", arguments='{"x": 1}'))])
    response = ChatCompletionResponse(id="chatcmpl-1", created=2, model="m", choices=[
        ChatCompletionChoice(index=0, message=message, finish_reason="tool_calls",
                             logprobs=ChatLogprobs(content=[ChatTokenLogprob(
                                 token="hi", logprob=-0.5, bytes=None, top_logprobs=[top])]))],
        usage=UsageInfo(prompt_tokens=1, completion_tokens=1, total_tokens=2))
    body = dumped(response)
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call.pop("id"))
    assert body == {"id": "chatcmpl-1", "object": "chat.completion", "created": 2, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "tool_calls", "stop_reason": None,
                                 "message": {"role": "assistant", "content": None, "tool_calls": [
                                     {"type": "function",
                                      "function": {"name": "f", "arguments": '{"x": 1}'}}]},
                                 "logprobs": {"content": [{
                                     "token": "hi", "logprob": -0.5, "bytes": None,
                                     "top_logprobs": [{"token": "hi", "logprob": -0.5,
                                                       "bytes": [104, 105]}]}]}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    text = dumped(ChatCompletionMessage(content="yo", reasoning_content="hmm"))
    assert text == {"role": "assistant", "content": "yo", "reasoning_content": "hmm"}


def test_chat_chunk_shape():
    first = ChatCompletionStreamResponse(id="chatcmpl-1", created=3, model="m", choices=[
        ChatCompletionStreamChoice(index=0, delta=DeltaMessage(role="assistant", content=""))])
    assert dumped(first) == {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                             "created": 3, "model": "m", "choices": [{
                                 "index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]}
    tool = DeltaToolCall(index=0, id="call_1", type="function",
                         function=DeltaFunctionCall(name="f", arguments=""))
    body = dumped(ChatCompletionStreamChoice(index=0, delta=DeltaMessage(tool_calls=[tool]),
                                             finish_reason="tool_calls"))
    assert body["delta"] == {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "f", "arguments": ""}}]}
    usage = dumped(ChatCompletionStreamResponse(model="m", usage=UsageInfo()))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def test_models_errors_and_ids():
    models = dumped(ModelList(data=[ModelCard(id="tiny", created=4, max_model_len=128)]))
    assert models == {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 4,
                                                  "owned_by": "radixserve",
                                                  "max_model_len": 128}]}
    body = error_body("bad", param="n", code=400)
    assert body == {"error": {"message": "bad", "type": "invalid_request_error", "param": "n",
                              "code": 400}}
    assert dumped(ErrorResponse(error=ErrorInfo(message="bad", param="n", code=400))) == body
    assert dumped(ErrorResponse(error=ErrorInfo(message="x")))["error"]["param"] is None
    assert re.fullmatch(r"abc-[0-9a-f]{32}", random_id("abc-"))
    assert random_id("x") != random_id("x")


# ----------------------------------------------------------------------------- through FastAPI


def test_fastapi_request_validation_error_body():
    app = FastAPI()

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        return JSONResponse(validation_error_body(exc), status_code=400)

    @app.post("/v1/chat/completions")
    async def create(request: ChatCompletionRequest) -> dict:
        return {"max_tokens": request.to_sampling_params(7).max_tokens}

    client = TestClient(app)
    url = "/v1/chat/completions"
    assert client.post(url, json={"messages": USER}).json() == {"max_tokens": 7}
    error = client.post(url, json={"messages": USER, "foo": 1}).json()["error"]
    assert (error["param"], error["message"]) == ("foo", "Unsupported parameter: 'foo'")
    error = client.post(url, json={"messages": [{"role": "bot", "content": "x"}]}).json()
    assert error["error"]["param"] == "messages.0.role"
    error = client.post(url, content=b'{"messages', headers={"content-type":
                                                              "application/json"}).json()
    assert error["error"]["param"] is None and "JSON" in error["error"]["message"]
    assert client.post(url).json()["error"]["message"] == "Missing request body"
    assert client.get("/openapi.json").status_code == 200


def test_chunk_template_equals_the_model_dump():
    import json as _json

    from radixserve.frontend.openai.protocol_chat import (
        ChatCompletionStreamChoice,
        ChatCompletionStreamResponse,
        DeltaMessage,
    )
    from radixserve.frontend.openai.serving import TEXT_MARK, ChunkTemplate, sse

    def completion(text):
        return CompletionStreamResponse(id="cmpl-1", created=1, model="m",
                                        choices=[CompletionResponseChoice(index=3, text=text)])

    def chat(text):
        return ChatCompletionStreamResponse(id="c", created=1, model="m", choices=[
            ChatCompletionStreamChoice(index=0, delta=DeltaMessage(content=text))])

    for build in (completion, chat):
        template = ChunkTemplate(build(TEXT_MARK))
        for text in ["plain", ' quo"te \\ back', "new\nline\t\x00", "héllo 🙂 \u2028"]:
            ours, reference = template.sse(text), sse(build(text))
            assert ours.startswith("data: ") and ours.endswith("\n\n")
            assert _json.loads(ours[6:]) == _json.loads(reference[6:])
