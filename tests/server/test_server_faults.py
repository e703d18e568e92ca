"""Fault handling of a real ``radixserve serve --mock-engine``: API keys, graceful shutdown
(SIGTERM / SIGINT), many concurrent streams, oversized bodies. Engine death and restarts:
test_server_engine_restart.py, test_server_no_engine_restart.py; faults inside engine steps:
test_server_step_faults.py.

Every server runs the mock engine (instant prefill, one random token per step, never EOS), so
each starts in a few seconds (mostly loading the GGUF tokenizer). Tests that stop or break
a server start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest
from server_proc import ServerProc

MOCK = ("--mock-engine",)
KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed():
    """Shared by the tests that leave the server as they found it."""
    s = ServerProc(*MOCK, "--api-key", KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture
def spawn():
    """Start a server for one test; whatever the test leaves running is stopped afterwards."""
    started: list[tuple[ServerProc, list[int]]] = []

    def start(*args: str, **kwargs) -> ServerProc:
        s = ServerProc(*args, timeout=120, **kwargs)
        started.append((s, s.engine_pids()))
        return s

    yield start
    for s, children in started:
        s.stop(signal.SIGTERM, timeout=10)
        for pid in _wait_gone(children, timeout=2):
            os.kill(pid, signal.SIGKILL)


# --- helpers -----------------------------------------------------------------------------------


def _assert_error(r: httpx.Response, status: int, type: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if type is not None:
        assert error["type"] == type, error
    return error


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ")
    except FileNotFoundError:
        return b""


def _engine_pid(server: ServerProc) -> int:
    """The engine-core child (not multiprocessing's resource tracker)."""
    pids = [p for p in server.engine_pids() if b"spawn_main" in _cmdline(p)]
    assert len(pids) == 1, [(p, _cmdline(p)) for p in server.engine_pids()]
    return pids[0]


def _gone(pid: int) -> bool:
    """The process no longer exists, or is a zombie about to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _data(lines):
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: "):]


def _stream_body(max_tokens: int, **extra) -> dict:
    return {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True, **extra}


class _Stream(threading.Thread):
    """A streaming completion read on a thread: ``payloads`` are its SSE data fields."""

    def __init__(self, url: str, body: dict, headers: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.headers = url, body, headers
        self.payloads: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=self.body,
                              headers=self.headers, timeout=httpx.Timeout(30)) as r:
                self.status = r.status_code
                for data in _data(r.iter_lines()):
                    self.payloads.append(data)
                    self.first.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.first.set()

    @property
    def done(self) -> bool:
        return bool(self.payloads) and self.payloads[-1] == "[DONE]"


# --- 1. API keys -------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
    {"Authorization": f"Bearer {KEY[:-1]}"},
], ids=["missing", "wrong", "no-scheme", "prefix"])
def test_api_key_rejects_bad_credentials(keyed, headers):
    url = keyed.url
    for r in (httpx.get(f"{url}/v1/models", headers=headers),
              httpx.post(f"{url}/v1/completions", headers=headers,
                         json={"prompt": "hi", "max_tokens": 2}),
              httpx.post(f"{url}/v1/completions", headers=headers,
                         json=_stream_body(2)),
              httpx.get(f"{url}/load", headers=headers)):
        error = _assert_error(r, 401, "authentication_error")
        assert error["code"] == "invalid_api_key"


def test_api_key_accepts_the_key_and_leaves_probes_open(keyed):
    url = keyed.url
    r = httpx.get(f"{url}/v1/models", headers=AUTH)
    assert r.status_code == 200 and r.json()["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", headers=AUTH, json={"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    for path in ("/health", "/version"):
        assert httpx.get(f"{url}{path}").status_code == 200
    assert httpx.get(f"{url}/version").json()["version"]
    # the official client sends the key the same way
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert client.models.list().data
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()


# --- 3./4. graceful shutdown -------------------------------------------------------------------


def test_sigterm_drains_in_flight_streams(spawn):
    s = spawn(*MOCK, "--drain-timeout", "20", "--max-model-len", "200000")
    children = s.engine_pids()
    engine = _engine_pid(s)
    # long enough (seconds on the mock, whose steps take microseconds) to still be running
    # when SIGTERM arrives
    max_tokens = 10000
    streams = [_Stream(s.url, _stream_body(max_tokens, stream_options={"include_usage": True}))
               for _ in range(4)]
    for t in streams:
        t.start()
    for t in streams:
        assert t.first.wait(15) and t.error is None, t.error
    assert not any(t.done for t in streams), "the streams finished before the signal"
    s.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert s.proc.wait(timeout=25) == 0, s.proc.stdout.read()
    exited_after = time.monotonic() - signalled
    for t in streams:
        t.join(10)
        assert not t.is_alive() and t.error is None, t.error
        assert t.status == 200 and t.done, t.payloads[-3:]
        usage = json.loads(t.payloads[-2])["usage"]
        assert usage["completion_tokens"] == max_tokens
        finishes = [c["finish_reason"] for p in t.payloads[:-2]
                    for c in json.loads(p)["choices"] if c["finish_reason"]]
        assert finishes == ["length"]
    assert exited_after < 20
    assert not _wait_gone([engine, *children])


def test_api_key_from_environment_then_sigint_exits_zero_within_the_drain_timeout(spawn):
    # one server for both, to keep the file fast (each start loads the GGUF tokenizer)
    s = spawn(*MOCK, "--drain-timeout", "2", "--max-model-len", "100000000",
              env={"RADIXSERVE_API_KEY": "from-env"})
    env_auth = {"Authorization": "Bearer from-env"}
    _assert_error(httpx.get(f"{s.url}/v1/models"), 401, "authentication_error")
    _assert_error(httpx.get(f"{s.url}/v1/models", headers=AUTH), 401, "authentication_error")
    assert httpx.get(f"{s.url}/v1/models", headers=env_auth).status_code == 200
    assert httpx.get(f"{s.url}/health").status_code == 200

    children = s.engine_pids()
    engine = _engine_pid(s)
    # an endless stream: the drain timeout (2 s) has to cut it
    stream = _Stream(s.url, _stream_body(90_000_000), env_auth)
    stream.start()
    assert stream.first.wait(15) and stream.error is None, stream.error
    s.proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    assert s.proc.wait(timeout=20) == 0, s.proc.stdout.read()
    assert time.monotonic() - signalled < 2 + 5
    stream.join(15)
    assert not stream.is_alive()
    assert stream.done  # ended by the drain (tests/server/test_drain.py): an error, [DONE]
    assert json.loads(stream.payloads[-2])["error"]["code"] == "server_shutting_down"
    assert not _wait_gone([engine, *children])


# --- 5. many concurrent streams ----------------------------------------------------------------


def test_many_concurrent_streams(keyed):
    url = keyed.url
    n, max_tokens = 128, 32

    async def one(client: httpx.AsyncClient) -> list[str]:
        body = _stream_body(max_tokens, stream_options={"include_usage": True})
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
        return events

    async def main():
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=url, headers=AUTH, limits=limits,
                                     timeout=httpx.Timeout(60)) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client) for _ in range(n))), 90)

    results = asyncio.run(main())
    assert len(results) == n
    ids = set()
    for events in results:
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 32
        finishes = [c["finish_reason"] for ch in chunks[:-1] for c in ch["choices"]
                    if c["finish_reason"]]
        assert finishes == ["length"]
        ids.add(chunks[0]["id"])
        assert {ch["id"] for ch in chunks} == {chunks[0]["id"]}
    assert len(ids) == n
    load = httpx.get(f"{url}/load", headers=AUTH).json()
    assert load["num_requests_running"] == 0 and load["num_pending_requests"] == 0, load
    assert load["num_requests_waiting"] == 0


# --- 6. oversized bodies -----------------------------------------------------------------------


def test_oversized_body_is_refused_and_the_server_keeps_serving(keyed):
    url = keyed.url
    body = b"x" * (33 * 1024 * 1024)
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(f"{url}{path}", content=body, timeout=60,
                       headers={**AUTH, "content-type": "application/json"})
        _assert_error(r, 413)
    assert httpx.get(f"{url}/health").status_code == 200
    r = httpx.post(f"{url}/v1/completions", headers=AUTH, json={"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_oversized_chunked_body_is_refused(keyed):
    def body():  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"prompt": "hi", "max_tokens": 1, "user": "'
        for _ in range(33):
            yield b"a" * (1024 * 1024)
        yield b'"}'

    r = httpx.post(f"{keyed.url}/v1/completions", content=body(), timeout=60,
                   headers={**AUTH, "content-type": "application/json"})
    _assert_error(r, 413)
