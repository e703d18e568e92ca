"""``radixserve serve --data-parallel-size 2`` (mock engines): SIGKILL of one replica under
streams fails only that replica's in-flight requests; the other replica's streams finish, the
server stays healthy and keeps answering while the dead replica is restarted, and /load and
/metrics show it come back."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from server_proc import ServerProc
from test_server_faults import _Stream, _stream_body, _wait_gone

NUM_STREAMS = 8
STEP_MS = 5
STREAM_TOKENS = 600  # ~3 s at one token per 5 ms step


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--mock-step-ms", str(STEP_MS), "--max-model-len", "100000",
                   "--data-parallel-size", "2", "--dp-routing", "round_robin", timeout=120)
    yield s
    children = s.engine_pids()
    assert s.stop() == 0
    assert not _wait_gone(children)


def _replica_metric(url: str, name: str, replica: int) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"{name}{{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for replica {replica} in /metrics")


def test_each_replica_is_pinned_to_its_own_cpus(server):
    pids = [r["pid"] for r in httpx.get(f"{server.url}/load").json()["replicas"]]
    sets = [os.sched_getaffinity(pid) for pid in pids]
    api = os.sched_getaffinity(server.proc.pid)
    if len(api) >= 2:
        assert not sets[0] & sets[1], sets
    assert set().union(*sets) == api, (sets, api)


def test_a_killed_replica_fails_only_its_own_requests_and_comes_back(server):
    load = httpx.get(f"{server.url}/load").json()
    assert load["data_parallel_size"] == 2 and [r["up"] for r in load["replicas"]] == [True, True]
    streams = [_Stream(server.url, _stream_body(STREAM_TOKENS)) for _ in range(NUM_STREAMS)]
    for t in streams:
        t.start()
    for t in streams:
        assert t.first.wait(30) and t.error is None, t.error
    load = httpx.get(f"{server.url}/load").json()
    assert [r["num_pending_requests"] for r in load["replicas"]] == [4, 4], load
    assert load["num_pending_requests"] == NUM_STREAMS
    state = httpx.get(f"{server.url}/v1/engine/state").json()  # the engine view, per replica
    assert state["data_parallel_size"] == 2
    assert [r["num_running"] for r in state["replicas"]] == [4, 4]
    assert state["num_running"] == NUM_STREAMS
    assert sorted({r["replica"] for r in state["running"]}) == [0, 1]
    dead_pid = load["replicas"][0]["pid"]
    os.kill(dead_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    views = []  # the engine view while replica 0 is away (watched from the kill on: a fast
    # restart can be over before the first request below)
    # a request sent before the API process has seen the death could still be routed there
    while (r := httpx.get(f"{server.url}/load").json()["replicas"][0])["up"] \
            and r["pid"] == dead_pid:
        assert time.monotonic() < deadline, "replica 0's death went unnoticed"
        views.append(httpx.get(f"{server.url}/v1/engine/state").json()["replicas"])
    views.append(httpx.get(f"{server.url}/v1/engine/state").json()["replicas"])

    # while replica 0 restarts: healthy, and new requests are answered (by replica 1)
    statuses = set()
    answered = 0
    while True:
        statuses.add(httpx.get(f"{server.url}/health").status_code)
        views.append(httpx.get(f"{server.url}/v1/engine/state").json()["replicas"])
        r = httpx.post(f"{server.url}/v1/completions",
                       json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200, r.text
        answered += 1
        replica0 = httpx.get(f"{server.url}/load").json()["replicas"][0]
        if replica0["up"] and replica0["pid"] not in (dead_pid, None):
            break
        assert time.monotonic() < deadline, "replica 0 was not restarted"
        time.sleep(0.05)
    assert statuses == {200} and answered >= 1
    down = [v for v in views if not v[0]["up"]]  # the view showed replica 0 down meanwhile
    assert down and "exited with code -9" in down[0][0]["error"] and down[0][1]["up"]

    for t in streams:
        t.join(60)
        assert not t.is_alive() and t.error is None and t.status == 200, t.error
        assert t.payloads[-1] == "[DONE]", t.payloads[-3:]
    failed = [t for t in streams if "error" in json.loads(t.payloads[-2])]
    finished = [t for t in streams if t not in failed]
    assert len(failed) == len(finished) == NUM_STREAMS // 2
    for t in failed:
        error = json.loads(t.payloads[-2])["error"]
        assert error["code"] == 503 and error["message"] == (
            "engine unavailable: replica 0: the engine process exited with code -9; it is "
            "being restarted")
    for t in finished:
        chunks = [json.loads(p) for p in t.payloads[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    assert _replica_metric(server.url, "radixserve:replica_engine_restarts_total", 0) == 1
    assert _replica_metric(server.url, "radixserve:replica_engine_restarts_total", 1) == 0
    assert _replica_metric(server.url, "radixserve:replica_up", 0) == 1
    # both replicas serve again: round robin reaches the new one
    for _ in range(4):
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200, r.text
    load = httpx.get(f"{server.url}/load").json()
    assert load["num_pending_requests"] == 0
    assert all(r["num_pending_requests"] == 0 for r in load["replicas"])
