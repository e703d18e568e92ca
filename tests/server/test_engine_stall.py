"""A hung engine under a real ``radixserve serve --mock-engine --engine-stall-timeout 2``: an
engine process stopped (SIGSTOP) with a stream in flight turns /health 503 with the reason
within a few seconds, the stream ends with an error event, and the engine is killed and
replaced; one stopped for less than the limit and continued (SIGCONT) fails nothing. Below,
the limit itself (`ProgressWatch`: slow steps raise it) and the client's reading of it."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import httpx
import msgspec
import pytest
import zmq
from server_proc import ServerProc
from test_server_engine_restart import _restarts
from test_server_faults import _Stream, _stream_body, _wait_gone

from radixserve.frontend.core_client import EngineCoreClient
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.frontend.progress_watch import ProgressWatch
from radixserve.messages import EngineCoreOutputs

STALL_S = 2.0


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "20", "--max-model-len", "1000000",
                   "--engine-stall-timeout", str(STALL_S), timeout=120)
    yield s
    children = s.engine_pids()
    for pid in children:
        os.kill(pid, signal.SIGCONT)  # a failed test may leave one stopped
    assert s.stop() == 0
    assert not _wait_gone(children)


def _health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health", timeout=5)


def test_a_stopped_engine_is_reported_failed_and_replaced(server):
    url = server.url
    assert (r := _health(url)).status_code == 200 and r.json() == {"status": "ok"}
    num_restarts = _restarts(url)
    stream = _Stream(url, _stream_body(100_000))
    stream.start()
    assert stream.first.wait(30) and stream.error is None and stream.status == 200
    engine = server.engine_pid()
    os.kill(engine, signal.SIGSTOP)
    stopped = time.monotonic()
    # The limit is the flag's 2 s unless a step of the last minutes took over a quarter of it
    # (ProgressWatch: a busy machine's slow step raises it); the reason names the limit used.
    while (r := _health(url)).status_code == 200:
        assert time.monotonic() - stopped < 30, "the stall was not noticed"
        time.sleep(0.02)
    noticed = time.monotonic() - stopped
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unhealthy", body
    m = re.fullmatch(r"the engine has made no progress for (\d+) s with 1 request in flight "
                     r"\(stall limit (\d+\.\d) s\); it is being restarted", body["reason"])
    assert m, body
    limit = float(m[2])
    assert limit >= STALL_S and limit - 0.1 <= noticed < limit + 3, (noticed, body)
    assert abs(int(m[1]) - noticed) <= 1.5, (noticed, body)

    stream.join(10)
    assert not stream.is_alive() and stream.error is None and stream.status == 200
    assert stream.payloads[-1] == "[DONE]", stream.payloads[-3:]
    error = json.loads(stream.payloads[-2])["error"]
    assert error["type"] == "service_unavailable" and error["code"] == 503, error
    assert error["message"] == f"engine unavailable: {body['reason']}"

    deadline = time.monotonic() + 60
    while _health(url).status_code != 200 or server.engine_pid() in (engine, None):
        assert time.monotonic() < deadline, "the engine was not replaced"
        time.sleep(0.05)
    assert not _wait_gone([engine]), "the stopped engine was not killed"
    assert _restarts(url) == num_restarts + 1
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def test_an_engine_continued_before_the_limit_fails_nothing(server):
    url = server.url
    num_restarts = _restarts(url)
    stream = _Stream(url, _stream_body(150))  # 3 s of 20 ms steps
    stream.start()
    assert stream.first.wait(30) and stream.error is None and stream.status == 200
    engine = server.engine_pid()
    os.kill(engine, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while time.monotonic() - stopped < STALL_S / 2:
            assert _health(url).status_code == 200
            time.sleep(0.05)
    finally:
        os.kill(engine, signal.SIGCONT)
    stream.join(30)
    assert not stream.is_alive() and stream.error is None and stream.status == 200
    assert stream.payloads[-1] == "[DONE]"
    assert all("error" not in json.loads(p) for p in stream.payloads[:-1])
    assert "".join(json.loads(p)["choices"][0]["text"] for p in stream.payloads[:-1])
    assert server.engine_pid() == engine and _restarts(url) == num_restarts
    assert _health(url).json() == {"status": "ok"}


def test_a_step_longer_than_the_limit_is_not_a_hang_while_its_layers_finish():
    """A model's step may take longer than the stall limit (a 2,048-token prefill of a 3B
    model on two AVX2 cores: more than 30 s). Its layers' sign of life (core_proc.Heartbeat,
    once a second between layers) keeps /health 200 and the request alive: a mock engine whose
    steps take twice the limit, slept in stand-in layers."""
    s = ServerProc("--mock-engine", "--mock-step-ms", str(int(2000 * STALL_S)),
                   "--engine-stall-timeout", str(STALL_S), timeout=120)
    try:
        engine = s.engine_pid()
        stream = _Stream(s.url, _stream_body(2))
        stream.start()
        t0 = time.monotonic()
        while stream.is_alive():
            assert _health(s.url).status_code == 200
            assert time.monotonic() - t0 < 60
            time.sleep(0.1)
        assert stream.error is None and stream.status == 200
        assert stream.payloads[-1] == "[DONE]"
        assert time.monotonic() - t0 > 2 * STALL_S  # at least one step ran the whole time
        assert s.engine_pid() == engine and _restarts(s.url) == 0
    finally:
        assert s.stop() == 0


def test_a_stopped_replica_fails_its_own_requests_and_is_replaced_alone():
    s = ServerProc("--mock-engine", "--mock-step-ms", "20", "--max-model-len", "1000000",
                   "--data-parallel-size", "2", "--dp-routing", "round_robin",
                   "--engine-stall-timeout", str(STALL_S), timeout=120)
    children = s.engine_pids()
    try:
        streams = [_Stream(s.url, _stream_body(250)) for _ in range(4)]  # 5 s each
        for t in streams:
            t.start()
        for t in streams:
            assert t.first.wait(30) and t.error is None and t.status == 200
        load = httpx.get(f"{s.url}/load").json()
        assert [r["num_pending_requests"] for r in load["replicas"]] == [2, 2], load
        stopped_pid = load["replicas"][0]["pid"]
        os.kill(stopped_pid, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while (r := httpx.get(f"{s.url}/load").json()["replicas"][0])["pid"] == stopped_pid \
                or not r["up"]:
            assert _health(s.url).status_code == 200  # replica 1 serves on
            assert time.monotonic() < deadline, "replica 0 was not replaced"
            time.sleep(0.05)
        for t in streams:
            t.join(30)
            assert not t.is_alive() and t.error is None and t.payloads[-1] == "[DONE]"
        errors = [json.loads(t.payloads[-2]).get("error") for t in streams]
        failed = [e["message"] for e in errors if e is not None]
        assert len(failed) == 2 and failed[0] == failed[1], errors
        assert re.fullmatch(r"engine unavailable: replica 0: the engine has made no progress "
                            r"for \d+ s with 2 requests in flight \(stall limit \d+\.\d s\); it "
                            r"is being restarted", failed[0]), failed
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
        assert not _wait_gone([stopped_pid])
    finally:
        for pid in s.engine_pids():
            os.kill(pid, signal.SIGCONT)
        s.stop()
        _wait_gone(children)


# --- the limit ---------------------------------------------------------------------------------


def _steps(watch: ProgressWatch, start: float, step_s: float, num: int) -> float:
    """``num`` steps of ``step_s`` from ``start`` (work arriving at an idle engine)."""
    watch.work_arrived(start, was_idle=True)
    now = start
    for _ in range(num):
        now += step_s
        watch.output_arrived(now, was_busy=True)
    return now


def test_fast_steps_leave_the_flag_as_the_limit():
    watch = ProgressWatch(0.0)
    now = _steps(watch, 10.0, 0.02, 50)
    assert watch.longest_step(now) == pytest.approx(0.02)
    assert watch.limit(2.0, now) == 2.0
    assert watch.silent_for(now + 1.5) == pytest.approx(1.5)


def test_slow_steps_raise_the_limit_for_the_window():
    watch = ProgressWatch(0.0, factor=4.0, window_s=600.0)
    now = _steps(watch, 10.0, 3.0, 2)  # two 3 s steps (long prefill chunks)
    now = _steps(watch, now, 0.05, 10)  # then fast decode steps
    assert watch.longest_step(now) == pytest.approx(3.0)
    assert watch.limit(2.0, now) == pytest.approx(12.0)  # 4 x 3 s
    assert watch.limit(30.0, now) == 30.0  # the flag stays the floor
    # once the slow steps (ended at 13 and 16) are older than the window, the fast ones
    # (16.05 to 16.5) set it again, and then nothing
    assert watch.longest_step(616.2) == pytest.approx(0.05)
    assert watch.limit(2.0, 616.2) == 2.0
    assert watch.longest_step(now + 601) == 0.0


def test_the_window_keeps_the_longest_step_still_in_it():
    watch = ProgressWatch(0.0, window_s=10.0)
    _steps(watch, 0.0, 5.0, 1)  # a 5 s step ending at 5
    watch.output_arrived(7.0, was_busy=True)  # a 2 s one at 7
    watch.output_arrived(8.0, was_busy=True)  # a 1 s one at 8
    assert watch.longest_step(8.0) == 5.0
    assert watch.longest_step(16.0) == 2.0  # the 5 s step left the window at 15
    assert watch.longest_step(17.5) == 1.0
    assert watch.longest_step(18.5) == 0.0


def test_idle_time_is_not_a_step():
    watch = ProgressWatch(0.0)
    watch.output_arrived(1.0, was_busy=False)  # e.g. fresh stats after an abort
    watch.work_arrived(100.0, was_idle=True)  # the clock starts with the work
    watch.output_arrived(100.05, was_busy=True)
    assert watch.longest_step(100.05) == pytest.approx(0.05)
    watch.work_arrived(100.06, was_idle=False)  # more work while busy: the clock runs on
    assert watch.silent_for(100.1) == pytest.approx(0.05)


def test_the_client_reads_a_stall_only_with_work_in_flight_and_nothing_unread(tmp_path):
    client = EngineCoreClient(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
    ctx = zmq.Context()
    engine = ctx.socket(zmq.PUSH)
    try:
        assert client.stalled(2.0) is None  # nothing in flight
        client.queues["a"] = OutputBuffer()
        client.queues["b"] = OutputBuffer()
        client.progress.reset(time.monotonic() - 3.0)
        reason = client.stalled(2.0)
        assert reason is not None and reason.startswith(
            "the engine has made no progress for 3 s with 2 requests in flight"), reason
        assert client.stalled(5.0) is None  # under the flag's limit
        engine.connect(client.output_addr)
        engine.send(msgspec.msgpack.encode(EngineCoreOutputs([])))
        deadline = time.monotonic() + 5
        while client.stalled(2.0) is not None:  # its message waits here: we are behind
            assert time.monotonic() < deadline
            time.sleep(0.01)
        client.dead = "gone"
        assert client.stalled(2.0) is None  # a dead engine is the supervisor's already
    finally:
        engine.close(linger=0)
        ctx.term()
        client.close_sockets()
