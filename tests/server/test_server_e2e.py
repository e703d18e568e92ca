"""The official openai client against a real ``radixserve serve`` on the embedded model."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_proc import ServerProc

GREEDY = dict(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0
    assert not s.engine_pids()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_completion_whole_and_streamed_agree(client, model):
    full = client.completions.create(model=model, prompt="The capital of France is", **GREEDY)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    choice = full.choices[0]
    assert "Paris" in choice.text and choice.finish_reason == "length"
    assert full.usage.completion_tokens == 12 and full.usage.prompt_tokens == 5
    assert full.usage.total_tokens == 17
    chunks = list(client.completions.create(model=model, prompt="The capital of France is",
                                            stream=True, stream_options={"include_usage": True},
                                            **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_whole_and_streamed_agree(client, model):
    messages = [{"role": "user", "content": "Name three primary colors."}]
    full = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                          max_tokens=30)
    assert full.object == "chat.completion"
    msg = full.choices[0].message
    assert msg.role == "assistant" and "Red" in msg.content
    assert full.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                            max_tokens=30, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content


def test_n_samples_and_seed_reproducibility(client, model):
    kwargs = dict(model=model, prompt="Once upon a time", max_tokens=10, temperature=1.0,
                  seed=123, n=2)
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert sorted(c.index for c in a.choices) == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text
    assert a.usage.completion_tokens == 20


def test_stop_strings_are_trimmed(client, model):
    full = client.completions.create(model=model, prompt="1, 2, 3, 4,", temperature=0,
                                     max_tokens=16).choices[0].text
    stop = full.split(",")[2].strip()
    out = client.completions.create(model=model, prompt="1, 2, 3, 4,", temperature=0,
                                    max_tokens=16, stop=[stop]).choices[0]
    assert out.finish_reason == "stop" and stop not in out.text
    streamed = client.completions.create(model=model, prompt="1, 2, 3, 4,", temperature=0,
                                         max_tokens=16, stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in streamed) == out.text


def test_logprobs_shapes(client, model):
    comp = client.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0,
                                     logprobs=3)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) == 3 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == comp.choices[0].text
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1
    for item in content:
        assert len(item.top_logprobs) == 2 and item.logprob <= 0
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob


@pytest.mark.parametrize("kwargs, status, param", [
    ({"model": "nope"}, 404, "model"),
    ({"temperature": -1}, 400, "temperature"),
    ({"top_p": 2}, 400, "top_p"),
    ({"max_tokens": 100_000}, 400, "max_tokens"),
    ({"n": 100}, 400, "n"),
    ({"logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, 400, None),
    ({"prompt": "word " * 9000}, 400, None),
    ({"suffix": "x"}, 400, "suffix"),
    ({"frobnicate": 1}, 400, "frobnicate"),
    ({"max_tokens": "many"}, 400, "max_tokens"),
])
def test_bad_completion_requests(server, kwargs, status, param):
    body = {"prompt": "hi", "max_tokens": 2, **kwargs}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_bad_chat_and_transport_errors(server):
    url = f"{server.url}/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}).status_code == 400
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(url, json={"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "f"}},
                              "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = httpx.post(url, content=b"x" * (33 * 1024 * 1024),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(f"{server.url}/nowhere").status_code == 404


def test_tokenize_detokenize_render(server, client, model):
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 8192
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    messages = [{"role": "user", "content": "Hi"}]
    rendered = httpx.post(f"{server.url}/v1/chat/completions/render",
                          json={"messages": messages}).json()
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert rendered["token_ids"] == rendered["prompt_token_ids"]  # vLLM's name, for routers
    [one] = httpx.post(f"{server.url}/v1/completions/render",
                       json={"prompt": "Hello world"}).json()
    assert one["token_ids"] == r["tokens"] and one["prompt"] == "Hello world"
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == rendered["count"]


def test_health_version_models_load_metrics(server, client):
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert "version" in httpx.get(f"{server.url}/version").json()
    card = client.models.list().data[0]
    assert card.object == "model" and card.owned_by == "radixserve"
    load = httpx.get(f"{server.url}/load").json()
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage"} <= set(load)
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("radixserve:request_success_total", "radixserve:prompt_tokens_total",
                 "radixserve:time_to_first_token_seconds", "radixserve:inter_token_latency",
                 "radixserve:e2e_request_latency_seconds", "radixserve:request_queue_time",
                 "radixserve:num_requests_running", "radixserve:kv_cache_usage_perc",
                 "radixserve:prefix_cache_queries"):
        assert name in text


def test_models_retrieve_by_id_in_each_sdk(server, client, model):
    card = client.models.retrieve(model)
    assert (card.id, card.object, card.owned_by) == (model, "model", "radixserve")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    r = httpx.get(f"{server.url}/v1/models/org/no-such-model")  # a slash in the id
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    import anthropic
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    info = claude.models.retrieve(model)
    assert (info.id, info.type, info.display_name) == (model, "model", model)
    assert [m.id for m in claude.models.list().data] == [model]
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("no-such-model")


def _idle(server) -> bool:
    load = httpx.get(f"{server.url}/load").json()
    return load["num_requests_running"] == 0 and load["kv_cache_usage"] == 0


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert httpx.get(f"{server.url}/load").json()["kv_cache_usage"] > 0
    deadline = time.monotonic() + 10
    while not _idle(server):
        assert time.monotonic() < deadline, "aborted request still holds KV blocks"
        time.sleep(0.1)


def _generated(server) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("radixserve:generation_tokens_total{"):
            return float(line.split()[-1])
    raise AssertionError("no radixserve:generation_tokens_total")


def test_generated_tokens_count_while_a_request_streams(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    before = _generated(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
        assert _generated(server) >= before + 5  # not only when the request finishes
    deadline = time.monotonic() + 10
    while not _idle(server):  # the abort frees it; its tokens stay counted
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert _generated(server) >= before + 5


def test_disconnect_non_streaming_frees_blocks(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=2)
    deadline = time.monotonic() + 10
    while not _idle(server):
        assert time.monotonic() < deadline, "aborted request still holds KV blocks"
        time.sleep(0.1)


def test_64_concurrent_streams_are_independent(server, model):
    prompts = [f"Count from {i}:" for i in range(64)]

    async def one(client, prompt):
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=6,
                                                 temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream])

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x",
                                      max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    texts = asyncio.run(run())
    assert len(texts) == 64 and all(texts)
    sync = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    for i in (0, 17, 63):
        alone = sync.completions.create(model=model, prompt=prompts[i], max_tokens=6,
                                        temperature=0).choices[0].text
        assert texts[i] == alone


def test_tool_calls_parse_from_hermes_text(server):
    """With the hermes parser, tool-call text becomes tool_calls (here the model is steered
    by logit_bias-free prompting is unreliable, so the parser is unit-tested separately; this
    checks the request path accepts tools and tool_choice=auto)."""
    r = httpx.post(f"{server.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}}}}}],
        "tool_choice": "auto", "max_tokens": 8, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_an_agent_loop_round_trips_with_content_null(client, model, server):
    """The second request of every agent loop: the assistant's tool call (content null, or
    absent) and the tool's result go back into the prompt (the generic format on this
    template: tokenizer/tool_prompt.py), through the openai SDK."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    for assistant in ({"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "assistant", "tool_calls": [call]}):
        messages = [{"role": "user", "content": "What's the weather in Paris?"}, assistant,
                    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}]
        r = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                           max_tokens=8, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        rendered = httpx.post(f"{server.url}/v1/chat/completions/render", json={
            "messages": messages, "tools": tools}).json()["prompt"]
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in rendered
        assert "<tool_response>\n22 C, sunny\n</tool_response>" in rendered
        assert '"name": "get_weather", "parameters"' in rendered  # the definitions


def test_streamed_logprobs_match_whole(client, model):
    kwargs = dict(model=model, prompt="Hello there", max_tokens=6, temperature=0, logprobs=2)
    whole = client.completions.create(**kwargs).choices[0].logprobs
    chunks = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kwargs)
              if c.choices and c.choices[0].logprobs]
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert [o for c in chunks for o in c.text_offset] == whole.text_offset


def test_echo_with_logprobs_scores_the_prompt(client, model):
    prompt = "The capital of France is Paris."
    ids = client.post("/../tokenize", cast_to=dict, body={"prompt": prompt})["tokens"]
    kwargs = dict(model=model, prompt=prompt, temperature=0, logprobs=2, echo=True)
    scored = client.completions.create(max_tokens=0, **kwargs).choices[0]
    assert scored.text == prompt and scored.finish_reason == "length"
    lp = scored.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == prompt and lp.text_offset[0] == 0
    # with a generated token (what lm-evaluation-harness sends): the prompt's part is the same
    one = client.completions.create(max_tokens=1, **kwargs).choices[0]
    assert one.logprobs.token_logprobs[:len(ids)] == lp.token_logprobs
    assert len(one.logprobs.tokens) == len(ids) + 1
    assert one.logprobs.text_offset[len(ids)] == len(prompt) and one.text.startswith(prompt)
    # streamed: the first chunk carries the echo and the prompt's logprobs
    chunks = [c.choices[0] for c in client.completions.create(max_tokens=1, stream=True,
                                                             **kwargs) if c.choices]
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.token_logprobs]
    assert tokens == one.logprobs.token_logprobs
    assert "".join(c.text for c in chunks) == one.text
    # vLLM's prompt_logprobs: {token id: {logprob, rank, decoded_token}} per prompt token
    body = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 1}).model_dump()
    prompt_lps = body["choices"][0]["prompt_logprobs"]
    assert prompt_lps[0] is None and len(prompt_lps) == len(ids)
    for token, entry, want in zip(ids[1:], prompt_lps[1:], lp.token_logprobs[1:]):
        assert entry[str(token)]["logprob"] == want
        assert any(e.get("rank") == 1 for e in entry.values())


def test_max_tokens_zero_is_for_completions_only(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"prompt": "hi", "max_tokens": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ""
    assert r.json()["usage"]["completion_tokens"] == 0
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"prompt": "hi", "prompt_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
