"""Truncation only when asked, on a real server whose context is small (a tiny llama, 256 tokens).

Without the flag a prompt too long is a 400 with the counts on every route, in its own shape;
with it (``truncate_prompt_tokens``, Ollama's ``truncate``, Responses' ``truncation: "auto"``)
the middle of a chat goes (the system message and the last turn stay; a tool call with its
results), a raw prompt keeps its end, and the answer says so: ``usage``'s details and the
``X-Radixserve-Truncated`` header (streams too)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model

CONTEXT = 256
HEADER = "x-radixserve-truncated"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_hf_model("llama", tmp_path_factory.mktemp("trunc") / "m", seed=5)
    s = ServerProc("--model", str(path), "--max-model-len", str(CONTEXT), timeout=180)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model(server) -> str:
    """The served model's name (the Anthropic and Ollama routes check it)."""
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def _num_tokens(server, messages: list[dict]) -> int:
    return _post(server, "/tokenize", {"messages": messages}).json()["count"]


LONG = "the quick brown fox jumps over the lazy dog " * 6
SYSTEM = {"role": "system", "content": "You are terse."}
LAST = {"role": "user", "content": "And now?"}


def _history() -> list[dict]:
    return [SYSTEM, {"role": "user", "content": LONG}, {"role": "assistant", "content": LONG},
            {"role": "user", "content": "short question"},
            {"role": "assistant", "content": "short answer"}, LAST]


def test_too_long_is_a_400_with_the_counts_on_every_route(server, model):
    assert _num_tokens(server, _history()) > CONTEXT
    chat = {"messages": _history(), "max_tokens": 4}
    r = _post(server, "/v1/chat/completions", chat)
    assert r.status_code == 400 and HEADER not in r.headers
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    r = _post(server, "/v1/completions", {"prompt": [5] * CONTEXT, "max_tokens": 4})
    assert r.status_code == 400 and f"{CONTEXT} in the prompt" in r.json()["error"]["message"]
    r = _post(server, "/v1/responses", {"input": _history()[1:], "instructions": "Be terse.",
                                        "max_output_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = _post(server, "/v1/messages", {"model": model, "max_tokens": 4, "system": "Be terse.",
                                       "messages": _history()[1:]})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"maximum context length is {CONTEXT} tokens" in body["error"]["message"]
    for truncate in ({}, {"truncate": False}):
        for path, request in (("/api/chat", {"messages": _history()}),
                              ("/api/generate", {"prompt": LONG * 2}),
                              ("/api/generate", {"prompt": LONG * 2, "raw": True})):
            r = _post(server, path, {"model": model, "stream": False, **request, **truncate})
            assert r.status_code == 400, (path, r.text)
            assert f"maximum context length is {CONTEXT} tokens" in r.json()["error"]


def test_chat_keeps_the_system_prompt_and_the_last_turns(server):
    r = _post(server, "/v1/chat/completions", {"messages": _history(), "max_tokens": 4,
                                               "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    kept = [SYSTEM, *_history()[3:]]  # the first turn went, whole
    assert usage["prompt_tokens"] == _num_tokens(server, kept)
    assert usage["prompt_tokens"] <= CONTEXT - 4
    details = usage["prompt_tokens_details"]
    assert details["dropped_messages"] == 2
    assert details["truncated_tokens"] == _num_tokens(server, _history()) - usage[
        "prompt_tokens"]
    assert r.headers[HEADER] == str(details["truncated_tokens"])
    # the render route shows the prompt as cut
    r = _post(server, "/v1/chat/completions/render", {
        "messages": _history(), "max_tokens": 4, "truncate_prompt_tokens": -1})
    assert len(r.json()["prompt_token_ids"]) == usage["prompt_tokens"]
    assert r.headers[HEADER] == str(details["truncated_tokens"])
    # a prompt that fits is not touched and says nothing
    r = _post(server, "/v1/chat/completions", {"messages": [SYSTEM, LAST], "max_tokens": 4,
                                               "truncate_prompt_tokens": -1})
    assert r.status_code == 200 and HEADER not in r.headers
    assert "truncated_tokens" not in r.json()["usage"]["prompt_tokens_details"]


def test_a_tool_call_goes_with_its_results(server):
    def call(name: str) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [{
            "id": name, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}

    def result(name: str, text: str) -> dict:
        return {"role": "tool", "tool_call_id": name, "content": text}

    # (the tiny tokenizer spends about a token a character, and its template writes each
    # call as a Hermes <tool_call>: a call and its result are about 90 tokens; a must go)
    messages = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "look"},
                call("a"), result("a", LONG), call("b"), result("b", "b"), call("c"),
                result("c", "c")]
    r = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                               "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    details = r.json()["usage"]["prompt_tokens_details"]
    assert details["dropped_messages"] == 2  # call a and its result, never one alone
    kept = messages[:2] + messages[4:]
    assert r.json()["usage"]["prompt_tokens"] == _num_tokens(server, kept)


def test_minimum_too_long_is_a_400_with_the_counts(server):
    messages = [{"role": "system", "content": LONG * 2}, *_history()[1:]]
    r = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4,
                                               "truncate_prompt_tokens": -1})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"may use {CONTEXT - 4}" in error["message"]
    assert "with only the system messages, the tools and the last turn" in error["message"]


def test_raw_prompts_keep_their_last_tokens(server):
    num_tokens = CONTEXT + 30
    r = _post(server, "/v1/completions", {"prompt": [5] * num_tokens, "max_tokens": 4,
                                          "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == CONTEXT - 4  # -1: the context less the completion
    assert usage["prompt_tokens_details"]["truncated_tokens"] == num_tokens - (CONTEXT - 4)
    assert r.headers[HEADER] == str(num_tokens - (CONTEXT - 4))
    r = _post(server, "/v1/completions", {"prompt": list(range(10, 60)), "max_tokens": 2,
                                          "truncate_prompt_tokens": 20, "echo": True,
                                          "temperature": 0})
    assert r.json()["usage"]["prompt_tokens"] == 20
    r = _post(server, "/v1/completions", {"prompt": [[5] * 30, [6] * 10], "max_tokens": 2,
                                          "truncate_prompt_tokens": 20})
    assert r.json()["usage"]["prompt_tokens"] == 30 and r.headers[HEADER] == "10"


def test_bad_values_are_400s_in_each_shape(server, model):
    for value in (0, -2, "10", 1.5, True, CONTEXT + 1):
        for path, body in (("/v1/completions", {"prompt": "hi"}),
                           ("/v1/chat/completions", {"messages": [LAST]})):
            r = _post(server, path, {**body, "truncate_prompt_tokens": value})
            assert r.status_code == 400, (path, value, r.text)
            assert "truncate_prompt_tokens" in r.text
    r = _post(server, "/api/chat", {"model": model, "messages": [LAST], "truncate": "yes"})
    assert r.status_code == 400 and "truncate" in r.json()["error"]
    r = _post(server, "/v1/responses", {"input": "hi", "truncation": "sometimes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation"


def test_streams_carry_the_header(server):
    body = {"messages": _history(), "max_tokens": 4, "truncate_prompt_tokens": -1,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200 and int(r.headers[HEADER]) > 0
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens_details"]["truncated_tokens"] == int(
        r.headers[HEADER])


def test_ollama_truncate_true_cuts_and_says_so(server, model):
    r = _post(server, "/api/chat", {"model": model, "messages": _history(), "stream": False,
                                    "truncate": True, "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == _num_tokens(server, [SYSTEM, *_history()[3:]])
    assert int(r.headers[HEADER]) > 0
    with httpx.stream("POST", f"{server.url}/api/generate", timeout=60, json={
            "model": model, "prompt": LONG * 2, "raw": True, "truncate": True,
            "options": {"num_predict": 4}}) as r:
        assert r.status_code == 200 and int(r.headers[HEADER]) > 0
        last = [json.loads(line) for line in r.iter_lines() if line][-1]
    assert last["done"] and last["prompt_eval_count"] == CONTEXT - 4


def test_responses_truncation_auto(server):
    r = _post(server, "/v1/responses", {"input": _history()[1:], "instructions": "Be terse.",
                                        "max_output_tokens": 4, "truncation": "auto",
                                        "store": False})
    assert r.status_code == 200, r.text
    response = r.json()
    assert response["truncation"] == "auto"
    details = response["usage"]["input_tokens_details"]
    assert details["dropped_messages"] == 2
    assert r.headers[HEADER] == str(details["truncated_tokens"])
