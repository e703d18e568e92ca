"""``POST /reset_prefix_cache`` (vLLM's) on a real server (the embedded model, KV events on)
with a subscriber written from vLLM's wire format: the reset publishes AllBlocksCleared and
the next identical prompt hits nothing; while a streamed request runs it is refused (409)
unless ``reset_running_requests=true``, which preempts it (the stream still completes);
SGLang's ``/flush_cache`` does the same reset; a bad boolean is a 400."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from kv_event_wire import AllBlocksCleared, BlockStored, Subscriber
from server_proc import ServerProc, free_port

PROMPT = "Tell me a long story about a lighthouse keeper and the sea. " * 6  # > 2 pages


@pytest.fixture(scope="module")
def server():
    port = free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}
    s = ServerProc("--served-model-name", "smol", "--threads", "1", "--kv-events-config",
                   json.dumps(config), timeout=240)
    s.events = f"tcp://127.0.0.1:{port}"
    yield s
    s.stop()


@pytest.fixture
def sub(server):
    s = Subscriber(server.events, b"kv")
    yield s
    s.close()


def _complete(server, max_tokens=2) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "model": "smol", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _cached_tokens(answer: dict) -> int:
    return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_reset_publishes_cleared_and_the_cache_is_empty(server, sub):
    _complete(server)
    assert _cached_tokens(_complete(server)) > 0  # the second time, the prompt hits
    sub.drain(0.5)
    r = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200 and r.content == b""
    events = [e for _, batch in sub.drain(1.0) for e in batch.events]
    assert events == [AllBlocksCleared()]
    assert _cached_tokens(_complete(server)) == 0
    stored = [e for _, batch in sub.drain(1.0) for e in batch.events]
    assert stored and isinstance(stored[0], BlockStored) and stored[0].parent_block_hash is None


def test_refused_while_running_unless_running_requests_are_reset(server, sub):
    first = threading.Event()
    result: dict = {}

    def stream():
        body = {"model": "smol", "prompt": PROMPT, "max_tokens": 120, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        n, finish = 0, None
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                          timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        n = chunk["usage"]["completion_tokens"]
                    for choice in chunk["choices"]:
                        finish = choice.get("finish_reason") or finish
                    first.set()
        result.update(n=n, finish=finish)

    t = threading.Thread(target=stream)
    t.start()
    assert first.wait(120)
    refused = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
    forced = httpx.post(f"{server.url}/reset_prefix_cache?reset_running_requests=true",
                        timeout=30)
    t.join(300)
    assert refused.status_code == 409, refused.text
    assert "running requests" in refused.json()["error"]["message"]
    assert forced.status_code == 200, forced.text
    assert result == {"n": 120, "finish": "length"}  # it resumed after its preemption
    assert any(isinstance(e, AllBlocksCleared) for _, b in sub.drain(1.0) for e in b.events)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'radixserve:kv_events_dropped_total{model_name="smol"} 0.0' in metrics


def test_flush_cache_and_bad_boolean(server, sub):
    _complete(server)
    sub.drain(0.5)
    r = httpx.post(f"{server.url}/flush_cache", timeout=30)
    assert r.status_code == 200 and r.text.startswith("Cache flushed")
    assert [e for _, b in sub.drain(1.0) for e in b.events] == [AllBlocksCleared()]
    bad = httpx.post(f"{server.url}/reset_prefix_cache?reset_running_requests=maybe",
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reset_running_requests"


def test_sglang_router_names_for_worker_info(server):
    """sglang-router 0.3.2 asks /server_info and /model_info before the /get_ names."""
    for name in ("server_info", "model_info"):
        new = httpx.get(f"{server.url}/{name}", timeout=10)
        old = httpx.get(f"{server.url}/get_{name}", timeout=10)
        assert new.status_code == 200 and new.json().keys() == old.json().keys()
