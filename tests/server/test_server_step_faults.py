"""A real server on a tiny model whose engine runs with fault injection
(``RADIXSERVE_FAULT_INJECT``): a step that raises fails the requests in it with a clear 500
(an error event and ``[DONE]`` in a stream), frees their KV, and the same engine process goes
on serving; then a kill -9 of the engine: it is replaced and serves the same KV pool.

Engine steps are counted from 1 per engine process and the requests below run one at a time,
so each fault lands in a known request: a prompt is prefilled in one step that also samples
the first token, and each further token takes one step (speculation off: a verified draft
emits several tokens in one step).
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from server_proc import ServerProc
from test_server_faults import _data
from tiny_models import make_hf_model

FAULTS = "forward@3,sample@8"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_hf_model("llama", tmp_path_factory.mktemp("faulty") / "m", seed=7)
    s = ServerProc("--model", str(path), "--num-kv-blocks", "64", "--block-size", "4",
                   "--speculative", "off", timeout=180, env={"RADIXSERVE_FAULT_INJECT": FAULTS})
    yield s
    assert s.stop() == 0


def _completion(url: str, max_tokens: int, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"prompt": "a b c", "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, **extra})


def _assert_idle(url: str) -> dict:
    load = httpx.get(f"{url}/load").json()
    assert (load["num_requests_running"], load["num_requests_waiting"], load["kv_cache_usage"],
            load["num_pending_requests"]) == (0, 0, 0.0, 0), load
    return load


def _restarts(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("radixserve:engine_restarts_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no radixserve:engine_restarts_total in /metrics")


def test_failed_steps_fail_their_requests_and_the_engine_goes_on(server):
    url = server.url
    engine = server.engine_pid()
    # steps 1-2 give two tokens, the forward of step 3 raises
    r = _completion(url, 5)
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["type"] == "internal_error"
    assert error["message"] == ("the model step failed: InjectedFault: injected forward fault "
                                "at engine step 3")
    _assert_idle(url)
    assert httpx.get(f"{url}/health").status_code == 200
    # a stream over steps 4..: the sampler of step 8 raises after four tokens
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                      json={"prompt": "a b c", "max_tokens": 10, "temperature": 0,
                            "ignore_eos": True, "stream": True, "logprobs": 1}) as s:
        assert s.status_code == 200
        events = list(_data(s.iter_lines()))
    assert events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert last["error"]["type"] == "internal_error" and last["error"]["code"] == 500
    assert "injected sample fault at engine step 8" in last["error"]["message"]
    # at most the four tokens before the fault: those that reach the API process together
    # with the error are not sent (the request has failed), and on a busy machine all four may
    # (the CI of 2026-12-06 saw none sent)
    num_tokens = sum(len(json.loads(e)["choices"][0]["logprobs"]["tokens"])
                     for e in events[:-2])
    assert num_tokens <= 4, events
    _assert_idle(url)
    # no more faults planned: the same engine process serves greedy output as usual
    ok = _completion(url, 6)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 6
    assert ok.json()["choices"][0]["finish_reason"] == "length"
    assert _completion(url, 6).json()["choices"][0]["text"] == ok.json()["choices"][0]["text"]
    _assert_idle(url)
    assert server.engine_pid() == engine and _restarts(url) == 0


def test_a_killed_engine_is_replaced_with_the_same_pool(server):
    url = server.url
    before = _assert_idle(url)
    engine = server.engine_pid()
    os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 90
    statuses = set()
    # (the death is noticed once the kernel has torn the process down: a few 200s may come
    # first; the new engine takes seconds to import torch and load). The new pid is read
    # before /health: the replacement is spawned only after the death was noticed, so a 200
    # after it means the new engine is ready (read the other way round, a 200 from before
    # the death was noticed could pass beside a replacement spawned just after it)
    while True:
        replaced = server.engine_pid() not in (engine, None)
        r = httpx.get(f"{url}/health")
        statuses.add(r.status_code)
        if r.status_code != 200:
            assert r.status_code == 503 and "being restarted" in r.json()["error"]["message"]
        elif replaced:
            break
        assert time.monotonic() < deadline, "the engine was not replaced"
        time.sleep(0.05)
    assert 503 in statuses and _restarts(url) == 1
    assert _assert_idle(url)["num_kv_blocks"] == before["num_kv_blocks"]
    # the new engine counts its steps afresh (faults at 3 and 8): two tokens take steps 1-2
    r = _completion(url, 2)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    _assert_idle(url)
