"""The official ollama client against a real ``radixserve serve`` on the embedded model:
chat and generate (whole and streamed agree), options, format, list/show/ps/version, greedy
/api/chat = /v1/chat/completions, bad input answered as {"error": ...} with a 4xx."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from server_proc import ServerProc

GREEDY = {"temperature": 0, "num_predict": 16}
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]


@pytest.fixture(scope="module")
def server():
    s = ServerProc()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def oc(server):
    return ollama.Client(host=server.url)


@pytest.fixture(scope="module")
def model(oc):
    return oc.list().models[0].model


def test_list_show_ps_version(oc, model, server):
    listed = oc.list().models[0]
    assert model.endswith(":latest") and listed.details.format == "gguf"
    assert listed.details.family == "llama" and listed.size > 1_000_000
    shown = oc.show(model)
    assert "completion" in shown.capabilities and "embedding" not in shown.capabilities
    assert "im_start" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama"
    assert oc.ps().models[0].model == model
    assert httpx.get(f"{server.url}/api/version").json()["version"]
    assert httpx.get(f"{server.url}/").text == "Ollama is running"


def test_chat_whole_and_streamed_agree(oc, model):
    full = oc.chat(model=model, messages=MESSAGES, options=GREEDY)
    assert full.done and full.done_reason == "length" and full.eval_count == 16
    assert full.message.role == "assistant" and "Red" in full.message.content
    parts = list(oc.chat(model=model, messages=MESSAGES, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == full.message.content
    assert parts[-1].eval_count == 16 and parts[-1].prompt_eval_count == full.prompt_eval_count


def test_generate_whole_streamed_and_raw(oc, model):
    full = oc.generate(model=model, prompt="Name three primary colors.", options=GREEDY)
    parts = list(oc.generate(model=model, prompt="Name three primary colors.",
                             options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == full.response and parts[-1].done
    chat = oc.chat(model=model, messages=MESSAGES, options=GREEDY)
    assert full.response == chat.message.content  # the prompt as a user message
    raw = oc.generate(model=model, prompt="The capital of France is", raw=True,
                      options={"temperature": 0, "num_predict": 8})
    assert "Paris" in raw.response and raw.eval_count == 8
    loaded = oc.generate(model=model, prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_greedy_api_chat_equals_chat_completions(oc, model, server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2 + 2?"}]
    ref = client.chat.completions.create(model=client.models.list().data[0].id, messages=msgs,
                                         temperature=0, max_tokens=24)
    got = oc.chat(model=model, messages=msgs, options={"temperature": 0, "num_predict": 24})
    assert got.message.content == ref.choices[0].message.content
    assert got.eval_count == ref.usage.completion_tokens
    assert got.prompt_eval_count == ref.usage.prompt_tokens


def test_options_and_format(oc, model):
    stopped = oc.chat(model=model, messages=MESSAGES,
                      options={"temperature": 0, "num_predict": 40, "stop": ["Blue", "blue"]})
    assert "lue" not in stopped.message.content and stopped.done_reason == "stop"
    seeded = [oc.generate(model=model, prompt="Tell me a story.", options={
        "temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 7, "num_predict": 12,
        "repeat_penalty": 1.1, "num_ctx": 2048}).response for _ in range(2)]
    assert seeded[0] == seeded[1]
    schema = {"type": "object", "properties": {"color": {"type": "string"}},
              "required": ["color"]}
    shaped = oc.chat(model=model, messages=[{"role": "user", "content": "A color as JSON."}],
                     format=schema, options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(shaped.message.content)["color"], str)
    as_json = oc.generate(model=model, prompt="A color as JSON.", format="json",
                          options={"temperature": 0, "num_predict": 40}, keep_alive="5m")
    assert as_json.response.startswith("{")  # constrained from the first token
    if as_json.done_reason == "stop":  # not cut by num_predict: a whole object
        assert isinstance(json.loads(as_json.response), dict)


@pytest.mark.parametrize("path, body, status, words", [
    ("/api/chat", {"model": "nope", "messages": MESSAGES}, 404, "not found"),
    ("/api/chat", {"model": "M", "messages": MESSAGES, "options": {"mirostat": 2}}, 400,
     "mirostat"),
    ("/api/chat", {"model": "M", "messages": MESSAGES, "options": {"bogus": 1}}, 400,
     "supported:"),
    ("/api/chat", {"model": "M", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/api/generate", {"model": "M", "prompt": "x", "context": [1, -2]}, 400, "context"),
    ("/api/generate", {"model": "M", "prompt": "x", "context": [10**6]}, 400, "context"),
    ("/api/generate", {"model": "M", "prompt": "x", "options": {"num_predict": 0}}, 400,
     "num_predict"),
    ("/api/chat", {"model": "M", "messages": MESSAGES, "format": {"type": "nonsense"}}, 400,
     "format"),
    ("/api/embed", {"model": "M", "input": "x"}, 400, "--task embed"),
    ("/api/show", {"model": "nope"}, 404, "not found"),
    ("/api/pull", {"model": "M"}, 404, "not supported"),
])
def test_bad_input_answers_in_ollama_shape(server, model, path, body, status, words):
    body = {k: (model if v == "M" else v) for k, v in body.items()}
    if path in ("/api/chat", "/api/generate"):
        body["stream"] = False
    r = httpx.post(f"{server.url}{path}", json=body)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and words in r.json()["error"], r.text
    ok = httpx.post(f"{server.url}/api/generate", json={
        "model": model, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    assert ok.status_code == 200 and ok.json()["done"]


def test_bodies_of_any_content_type_as_ollama_reads_them(server, model):
    body = json.dumps({"model": model, "prompt": "Hi", "stream": False,
                       "options": {"num_predict": 2}})
    for headers in ({"Content-Type": "application/x-www-form-urlencoded"},  # curl -d
                    {"Content-Type": "text/plain"}, {}):
        r = httpx.post(f"{server.url}/api/generate", content=body, headers=headers)
        assert r.status_code == 200 and r.json()["done"], (headers, r.text)
    # from a browser page (Origin) a body must still be declared JSON; refused in Ollama's shape
    r = httpx.post(f"{server.url}/api/generate", content=body,
                   headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert r.status_code == 415 and list(r.json()) == ["error"], r.text
    # the OpenAI routes keep requiring JSON
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "error" in r.json() and "message" in r.json()["error"]


def test_generate_context_round_trips(oc, model, server):
    first = oc.generate(model=model, prompt="My name is Ada.", options=GREEDY)
    tokenize = httpx.post(f"{server.url}/tokenize", json={
        "messages": [{"role": "user", "content": "My name is Ada."}]}).json()["tokens"]
    assert first.context[:len(tokenize)] == tokenize  # the prompt as the model read it
    assert len(first.context) > len(tokenize)  # and the answer after it
    # the next prompt after that context: the same as the conversation written out as tokens
    second = oc.generate(model=model, prompt="What is my name?", context=first.context,
                         options=GREEDY)
    then = httpx.post(f"{server.url}/tokenize", json={
        "messages": [{"role": "user", "content": "What is my name?"}]}).json()["tokens"]
    as_tokens = httpx.post(f"{server.url}/v1/completions", json={
        "prompt": first.context + then, "temperature": 0, "max_tokens": 16}).json()
    assert second.response == as_tokens["choices"][0]["text"]
    assert second.context[:len(first.context)] == first.context
    assert second.prompt_eval_count == len(first.context) + len(then)
    streamed = list(oc.generate(model=model, prompt="What is my name?", context=first.context,
                                options=GREEDY, stream=True))
    assert streamed[-1].context == second.context
    raw = oc.generate(model=model, prompt="1, 2, 3,", raw=True, options=GREEDY)
    assert raw.context[:4] == httpx.post(f"{server.url}/tokenize",
                                         json={"prompt": "1, 2, 3,"}).json()["tokens"][:4]


@pytest.mark.parametrize("raw, words", [
    ('"options": {"temperature": NaN}', "options.temperature"),
    ('"options": {"top_p": Infinity}', "options.top_p"),
    ('"options": {"temperature": -Infinity}', "options.temperature"),
    ('"options": {"seed": 1e309}', "options.seed"),
    ('"options": {"stop": ["a", NaN]}', "options.stop"),
    ('"stream": "yes"', "stream"),
    ('"keep_alive": NaN', "keep_alive"),
    ('"options": {"temperature": "0.5"}', "temperature"),
    ('"options": {"top_k": 4.5}', "top_k"),
])
def test_non_finite_and_mistyped_values_are_refused(server, model, raw, words):
    for path, head in (("/api/chat", f'"messages": {json.dumps(MESSAGES)}'),
                       ("/api/generate", '"prompt": "Hi"')):
        body = f'{{"model": "{model}", {head}, {raw}}}'
        r = httpx.post(f"{server.url}{path}", content=body)
        assert r.status_code == 400, (path, raw, r.text)
        assert list(r.json()) == ["error"] and words in r.json()["error"], (path, r.text)
