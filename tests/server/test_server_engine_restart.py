"""kill -9 of the engine process under a real ``radixserve serve --mock-engine``: in-flight
streams end at once with an error event and ``[DONE]``, new requests get 503 while the API
process starts a new engine, /health is 503 only until it is ready, and then everything works
again: /load back at zero, the next requests succeed, the restarts counted in /metrics. A
second death in a row is recovered from too (after a back-off)."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from server_proc import ServerProc
from test_server_faults import _Stream, _stream_body, _wait_gone

NUM_STREAMS = 16


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "5", "--max-model-len", "1000000",
                   timeout=120)
    yield s
    children = s.engine_pids()
    assert s.stop() == 0
    assert not _wait_gone(children)


def _restarts(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("radixserve:engine_restarts_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no radixserve:engine_restarts_total in /metrics")


def _assert_idle(url: str) -> None:
    load = httpx.get(f"{url}/load").json()
    assert (load["num_requests_running"], load["num_requests_waiting"], load["kv_cache_usage"],
            load["num_pending_requests"]) == (0, 0, 0.0, 0), load


def _kill_under_streams(server: ServerProc) -> float:
    """Kill the engine under NUM_STREAMS endless streams; seconds until all had ended."""
    streams = [_Stream(server.url, _stream_body(900_000)) for _ in range(NUM_STREAMS)]
    for t in streams:
        t.start()
    for t in streams:
        assert t.first.wait(30) and t.error is None, t.error
    time.sleep(0.2)  # all flowing
    engine = server.engine_pid()
    os.kill(engine, signal.SIGKILL)
    killed = time.monotonic()
    for t in streams:
        t.join(10)
    ended_after = time.monotonic() - killed
    for t in streams:
        assert not t.is_alive() and t.error is None and t.status == 200, t.error
        assert t.payloads[-1] == "[DONE]", t.payloads[-3:]
        error = json.loads(t.payloads[-2])["error"]
        assert error["type"] == "service_unavailable" and error["code"] == 503
        assert error["message"] == ("engine unavailable: the engine process exited with "
                                    "code -9; it is being restarted")
    return ended_after


def _wait_recovered(server: ServerProc, dead_pid: int, timeout: float = 60) -> set[int]:
    """Poll /health until a new engine serves; the statuses seen on the way."""
    deadline = time.monotonic() + timeout
    seen = set()
    while ((r := httpx.get(f"{server.url}/health")).status_code != 200
           or server.engine_pid() in (dead_pid, None)):
        seen.add(r.status_code)
        if r.status_code != 200:
            assert r.status_code == 503, r.text
            assert "being restarted" in r.json()["error"]["message"]
        assert time.monotonic() < deadline, "the engine was not replaced"
        time.sleep(0.02)
    return seen


def test_kill_9_ends_streams_then_a_new_engine_serves(server):
    url = server.url
    engine = server.engine_pid()
    ended_after = _kill_under_streams(server)
    assert ended_after < 3, ended_after
    # while it restarts: 503 up front, for streamed and plain requests alike
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    statuses = {r.status_code}
    if r.status_code == 503:
        assert r.json()["error"]["type"] == "service_unavailable"
    seen = _wait_recovered(server, engine)
    assert 503 in statuses | seen  # the restart takes a spawn and imports: it is seen
    assert _restarts(url) == 1
    _assert_idle(url)
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    with httpx.stream("POST", f"{url}/v1/completions", json=_stream_body(5),
                      timeout=30) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert s.status_code == 200 and events[-1] == "[DONE]"
    assert all("error" not in json.loads(e) for e in events[:-1])
    _assert_idle(url)


def test_a_second_death_in_a_row_is_recovered_after_a_back_off(server):
    url = server.url
    if _restarts(url) == 0:  # run alone: a first death, so that the next one is the second
        engine = server.engine_pid()
        _kill_under_streams(server)
        _wait_recovered(server, engine)
    num_restarts = _restarts(url)
    engine = server.engine_pid()
    _kill_under_streams(server)
    killed = time.monotonic()
    _wait_recovered(server, engine)
    assert time.monotonic() - killed >= 0.5  # the second consecutive failure waits 0.5 s
    assert _restarts(url) == num_restarts + 1
    _assert_idle(url)
    r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
