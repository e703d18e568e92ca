"""Prompt progress (llama-server's ``return_progress``) through a real ``radixserve serve`` on the
embedded model, with a 32-token step budget so a prompt of a few hundred tokens prefills in
many chunks: the progress events of each API's stream (OpenAI chat and completions, Responses,
Anthropic, llama.cpp's /infill, Ollama when asked), their order and counts, the prefix-cache hit on a repeated
prompt, the SDKs reading the streams, and streams without the flag unchanged."""

from __future__ import annotations

import json
import math
import uuid

import anthropic
import httpx
import openai
import pytest
from server_proc import ServerProc
from tiny_fim import make_fim_gguf, make_fim_hf_model

BUDGET = 32  # --max-num-batched-tokens: the prefill chunk
PROGRESS_KEYS = {"total", "cache", "processed", "time_ms"}


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--max-num-batched-tokens", str(BUDGET))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def _long_text() -> str:
    """A prompt of a few hundred tokens that no earlier test cached (its first words differ)."""
    return f"Note {uuid.uuid4().hex}. " + "The quick brown fox jumps over the lazy dog. " * 30


def _sse(server, path: str, body: dict) -> list[tuple[str | None, str]]:
    """The stream's events as (event name, data), comments left out."""
    events, name = [], None
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, line[len("data: "):]))
                name = None
    return events


def _chunks(events) -> list[dict]:
    return [json.loads(data) for _, data in events if data != "[DONE]"]


def _check_progress(reports: list[dict], total: int, cache: int | None = None) -> None:
    """A report per chunk of the uncached prompt, ``processed`` rising to ``total``: each a
    chunk's end, strictly increasing, the last the prompt's end (reports that reach the API
    process together are merged to the latest, so under load one may stand for several
    chunks). ``cache`` None: at most the chat template's head, which every request shares."""
    assert reports and all(set(p) == PROGRESS_KEYS for p in reports)
    if cache is None:
        cache = reports[0]["cache"]
        assert cache < BUDGET
    assert {(p["total"], p["cache"]) for p in reports} == {(total, cache)}
    processed = [p["processed"] for p in reports]
    chunk_ends = [min(total, cache + BUDGET * (i + 1))
                  for i in range(math.ceil((total - cache) / BUDGET))]
    assert processed == sorted(set(processed)) and set(processed) <= set(chunk_ends)
    assert processed[-1] == total
    times = [p["time_ms"] for p in reports]
    assert times == sorted(times) and times[0] >= 0


def _text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c["choices"])


def _chat_body(model, text, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
            "temperature": 0, "max_tokens": 6, "stream_options": {"include_usage": True},
            **extra}


def test_chat_stream_reports_each_chunk_before_the_tokens(server, model):
    chunks = _chunks(_sse(server, "/v1/chat/completions",
                          _chat_body(model, _long_text(), return_progress=True)))
    total = chunks[-1]["usage"]["prompt_tokens"]
    assert total > 8 * BUDGET
    first_text = next(i for i, c in enumerate(chunks)
                      if c["choices"] and c["choices"][0]["delta"].get("content"))
    progress = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    assert progress == list(range(1, len(progress) + 1))  # after the role chunk, before text
    assert progress[-1] < first_text
    for i in progress:  # llama-server's chunk: the assistant role, no content, the progress
        c = chunks[i]
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
        assert c["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": None},
                                 "logprobs": None, "finish_reason": None}]
    _check_progress([chunks[i]["prompt_progress"] for i in progress], total)


def test_without_the_flag_the_stream_is_unchanged(server, model):
    text = _long_text()
    plain = _chunks(_sse(server, "/v1/chat/completions", _chat_body(model, text)))
    assert not any("prompt_progress" in c for c in plain)
    flagged = _chunks(_sse(server, "/v1/chat/completions",
                           _chat_body(model, text, return_progress=True)))
    others = [c for c in flagged if "prompt_progress" not in c]
    # the same chunks but for the progress ones (where the text splits between chunks
    # depends on the timing, as always); the repeated prompt comes from the prefix cache
    cached = flagged[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert _text(others) == _text(plain)
    for a, b in ((others[0], plain[0]), (others[-2], plain[-2])):  # role, finish
        assert {k: v for k, v in a.items() if k not in ("id", "created")} == {
            k: v for k, v in b.items() if k not in ("id", "created")}
    assert {json.dumps(sorted(c)) for c in others} == {json.dumps(sorted(c)) for c in plain}
    _check_progress([c["prompt_progress"] for c in flagged if "prompt_progress" in c],
                    plain[-1]["usage"]["prompt_tokens"], cached)


def test_repeated_prompt_counts_the_cache(server, model):
    text = _long_text()
    body = _chat_body(model, text, return_progress=True)
    first = [c["prompt_progress"] for c in _chunks(_sse(server, "/v1/chat/completions", body))
             if "prompt_progress" in c]
    again = [c["prompt_progress"] for c in _chunks(_sse(server, "/v1/chat/completions", body))
             if "prompt_progress" in c]
    total = first[0]["total"]
    assert first[0]["cache"] < BUDGET and again[0]["cache"] > total // 2
    assert len(again) < len(first)
    _check_progress(again, total, again[0]["cache"])


def test_openai_sdk_reads_the_streams(server, model):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    text = _long_text()
    messages = [{"role": "user", "content": text}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                           max_tokens=6, extra_body={"return_progress": True})
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=6, stream=True,
        extra_body={"return_progress": True}))
    reports = [c.model_extra["prompt_progress"] for c in chunks
               if (c.model_extra or {}).get("prompt_progress")]
    assert reports and reports[-1]["processed"] == reports[-1]["total"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        whole.choices[0].message.content)
    stream = list(client.completions.create(model=model, prompt=text, temperature=0,
                                            max_tokens=4, stream=True,
                                            extra_body={"return_progress": True}))
    reports = [c.model_extra["prompt_progress"] for c in stream
               if (c.model_extra or {}).get("prompt_progress")]
    assert reports and reports[-1]["processed"] == reports[-1]["total"]
    assert all(c.choices[0].text == "" for c in stream if (c.model_extra or {}).get(
        "prompt_progress"))


def test_completions_progress_chunk_shape(server, model):
    text = _long_text()
    chunks = _chunks(_sse(server, "/v1/completions", {
        "model": model, "prompt": text, "stream": True, "max_tokens": 3, "temperature": 0,
        "return_progress": True, "echo": True}))
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress[0]["choices"] == [{"index": 0, "text": "", "logprobs": None,
                                      "finish_reason": None}]
    assert progress[0]["object"] == "text_completion"
    # the echo goes with the first token's chunk, not with a progress chunk
    echo = [c for c in chunks if "prompt_progress" not in c and c["choices"]]
    assert echo[0]["choices"][0]["text"].startswith(text)


@pytest.mark.parametrize("value", ["true", 1, None, [True]])
def test_a_non_boolean_flag_is_a_400(server, model, value):
    for path, body in (("/v1/chat/completions", _chat_body(model, "hi")),
                       ("/v1/completions", {"model": model, "prompt": "hi", "stream": True})):
        r = httpx.post(f"{server.url}{path}", json={**body, "return_progress": value})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and "return_progress" in (
            error["param"] or error["message"])
    r = httpx.post(f"{server.url}/v1/responses", json={
        "model": model, "input": "hi", "stream": True, "return_progress": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_progress"
    r = httpx.post(f"{server.url}/v1/messages", json={
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "stream": True, "return_progress": value})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "return_progress" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/api/chat", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}],
        "return_progress": value})
    assert r.status_code == 400 and "return_progress" in r.json()["error"]


def test_not_streamed_the_flag_changes_nothing(server, model):
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "temperature": 0, "max_tokens": 5}
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=body).json()
    flagged = httpx.post(f"{server.url}/v1/chat/completions",
                         json={**body, "return_progress": True}).json()
    assert flagged["choices"] == plain["choices"] and "prompt_progress" not in flagged


def test_responses_stream_sends_in_progress_events(server, model):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    kw = {"model": model, "input": _long_text(), "temperature": 0, "max_output_tokens": 8,
          "extra_body": {"return_progress": True}}
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    progress = [e for e in events if (e.model_extra or {}).get("prompt_progress")]
    assert all(e.type == "response.in_progress" for e in progress)
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    total = progress[0].model_extra["prompt_progress"]["total"]
    _check_progress([e.model_extra["prompt_progress"] for e in progress], total)
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.input_tokens == total
    # the SDK's stream helper accumulates over the repeated in_progress events
    with client.responses.stream(**kw) as stream:
        helper = list(stream)
    # (the prompt is cached now: one chunk left, one report)
    assert [e.type for e in helper].count("response.in_progress") == 2
    assert helper[-1].type == events[-1].type
    assert helper[-1].response.output_text == events[-1].response.output_text


def test_anthropic_stream_sends_pings_after_message_start(server, model):
    text = _long_text()
    body = {"model": model, "max_tokens": 6, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": text}], "return_progress": True}
    events = _sse(server, "/v1/messages", body)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    progress = [json.loads(d) for n, d in events if n == "ping" and "prompt_progress" in d]
    start = json.loads(events[0][1])["message"]["usage"]
    total = start["input_tokens"] + start["cache_read_input_tokens"]
    _check_progress([p["prompt_progress"] for p in progress], total)
    assert all(p["type"] == "ping" for p in progress)
    assert names.count("message_start") == 1 and names[-1] == "message_stop"
    # the SDK skips the pings: its text is the stream without the flag's
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    kw = {"model": model, "max_tokens": 6, "messages": [{"role": "user", "content": text}]}
    with client.messages.stream(**kw, extra_body={"temperature": 0,
                                                  "return_progress": True}) as stream:
        flagged = stream.get_final_message()
    plain = client.messages.create(**kw, extra_body={"temperature": 0})
    assert flagged.content[0].text == plain.content[0].text


def _ndjson(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def test_ollama_progress_only_when_asked(server, model):
    text = _long_text()
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "options": {"num_predict": 3, "temperature": 0}}
    plain = _ndjson(server, "/api/chat", body)
    assert plain and not any("prompt_progress" in line for line in plain)
    assert plain[-1]["done"] is True
    lines = _ndjson(server, "/api/chat", {**body, "return_progress": True})
    progress = [line for line in lines if "prompt_progress" in line]
    assert progress and lines.index(progress[-1]) == len(progress) - 1  # all come first
    assert all(p["message"] == {"role": "assistant", "content": ""} and p["done"] is False
               for p in progress)
    assert progress[-1]["prompt_progress"]["processed"] == lines[-1]["prompt_eval_count"]
    assert "".join(line["message"]["content"] for line in lines) == "".join(
        line["message"]["content"] for line in plain)
    generate = _ndjson(server, "/api/generate", {"model": model, "prompt": _long_text(),
                                                 "options": {"num_predict": 2},
                                                 "return_progress": True})
    progress = [line for line in generate if "prompt_progress" in line]
    assert progress and all(p["response"] == "" for p in progress)
    whole = httpx.post(f"{server.url}/api/chat", json={**body, "stream": False,
                                                       "return_progress": True}, timeout=120)
    assert "prompt_progress" not in whole.json() and whole.json()["done"] is True


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fim")
    path = make_fim_gguf(make_fim_hf_model(root / "hf"), root / "gguf" / "fim.gguf")
    s = ServerProc("--model", str(path), "--num-kv-blocks", "64",
                   "--max-num-batched-tokens", "16", timeout=180)
    yield s
    assert s.stop() == 0


def test_infill_stream_reports_progress(fim_server):
    body = {"input_prefix": "def add(a, b):\n    return " * 4, "input_suffix": "\nprint(1)\n",
            "stream": True, "n_predict": 3, "temperature": 0, "return_progress": True}
    objects = _chunks(_sse(fim_server, "/infill", body))
    progress = [o for o in objects if "prompt_progress" in o]
    assert progress and objects.index(progress[-1]) == len(progress) - 1  # all come first
    for o in progress:
        assert {k: o[k] for k in ("index", "content", "tokens", "stop")} == {
            "index": 0, "content": "", "tokens": [], "stop": False}
    total = objects[-1]["tokens_evaluated"]
    assert objects[-1]["stop"] is True
    reports = [o["prompt_progress"] for o in progress]
    assert {p["total"] for p in reports} == {total} and reports[-1]["processed"] == total
    assert [p["processed"] for p in reports] == sorted({p["processed"] for p in reports})
    plain = _chunks(_sse(fim_server, "/infill", {**body, "return_progress": False}))
    assert not any("prompt_progress" in o for o in plain)
