"""A drain that outlives ``--drain-timeout`` ends every open stream in its API's own way:
SIGTERM with a long stream open on each API (the mock engine at 50 ms a step, so none can
finish in the 2 s drain), then each ends with its error and terminator, a request waiting for
its whole answer gets a 503, and the server exits 0 with no traceback in its output."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
from server_proc import ServerProc

DRAIN_S = 2.0
LONG = 100_000  # tokens: far more than the drain lets run at 50 ms a step
ASK = [{"role": "user", "content": "hi"}]


def _streams(model: str) -> dict[str, tuple[str, dict]]:
    """name -> (path, body) of one long stream per API."""
    return {
        "chat": ("/v1/chat/completions", {"messages": ASK, "max_tokens": LONG, "stream": True}),
        "completions": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": LONG,
                                            "stream": True}),
        "responses": ("/v1/responses", {"model": model, "input": "hi", "stream": True,
                                        "max_output_tokens": LONG}),
        "anthropic": ("/v1/messages", {"model": model, "messages": ASK, "max_tokens": LONG,
                                       "stream": True}),
        "ollama": ("/api/chat", {"model": model, "messages": ASK,
                                 "options": {"num_predict": LONG}}),
    }


async def _read(client: httpx.AsyncClient, path: str, body: dict,
                started: asyncio.Event) -> tuple[int, str]:
    """(status, the whole body) of one stream, status None if the server cut it mid-body;
    ``started`` is set at its first bytes."""
    parts = []
    async with client.stream("POST", path, json=body) as r:
        try:
            async for part in r.aiter_text():
                parts.append(part)
                started.set()
        except httpx.RemoteProtocolError:
            return None, "".join(parts)
    return r.status_code, "".join(parts)


def _sse(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each server-sent event."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields.get("event"), fields["data"]))
    return events


def _check_openai(text: str) -> None:
    events = _sse(text)
    assert [data for _, data in events[-1:]] == ["[DONE]"], events[-3:]
    error = json.loads(events[-2][1])["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "server_shutting_down"
    assert "shutting down" in error["message"], error


def _check_responses(text: str) -> None:
    events = _sse(text)
    (name, data), (last_name, last_data) = events[-2:]
    assert name == "error" and json.loads(data)["type"] == "error", events[-3:]
    assert "shutting down" in json.loads(data)["message"]
    failed = json.loads(last_data)
    assert last_name == failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == json.loads(data)["message"]
    numbers = [json.loads(d)["sequence_number"] for _, d in events]
    assert numbers == list(range(len(events)))


def _check_anthropic(text: str) -> None:
    name, data = _sse(text)[-1]
    body = json.loads(data)
    assert name == "error" and body["type"] == "error", (name, data)
    assert body["error"]["type"] == "overloaded_error", body  # Anthropic's 503
    assert "shutting down" in body["error"]["message"]


def _check_ollama(text: str) -> None:
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) > 1 and "error" not in lines[0]
    assert set(lines[-1]) == {"error"} and "shutting down" in lines[-1]["error"], lines[-1]


CHECKS = {"chat": _check_openai, "completions": _check_openai, "responses": _check_responses,
          "anthropic": _check_anthropic, "ollama": _check_ollama}


def test_drain_timeout_ends_every_stream_in_its_api_shape():
    s = ServerProc("--mock-engine", "--mock-step-ms", "50", "--drain-timeout", str(DRAIN_S),
                   "--max-model-len", str(2 * LONG))
    try:
        model = httpx.get(f"{s.url}/v1/models").json()["data"][0]["id"]

        async def main() -> dict[str, tuple[int, str]]:
            async with httpx.AsyncClient(base_url=s.url, timeout=30) as client:
                started = {name: asyncio.Event() for name in CHECKS}
                reads = {name: asyncio.ensure_future(_read(client, path, body, started[name]))
                         for name, (path, body) in _streams(model).items()}
                whole = asyncio.ensure_future(client.post("/v1/chat/completions", json={
                    "messages": ASK, "max_tokens": LONG}))
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())),
                                       15)
                s.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                done = dict(zip(reads, await asyncio.gather(*reads.values())))
                ended_after = time.monotonic() - signalled
                assert DRAIN_S - 0.5 < ended_after < DRAIN_S + 1.5, ended_after
                r = await whole
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "server_shutting_down"
                return done

        answers = asyncio.run(main())
        assert s.proc.wait(timeout=20) == 0
        output = s.proc.stdout.read()
    finally:
        s.stop()
    bad = {}  # the streams that did not end in their API's shape
    for name, (status, text) in answers.items():
        try:
            assert status == 200, status
            CHECKS[name](text)
        except (AssertionError, ValueError, KeyError, IndexError) as exc:
            bad[name] = f"{exc!r}: ...{text[-300:]!r}"
    print(f"streams ended cleanly: {len(answers) - len(bad)}/{len(answers)}; "
          f"tracebacks in the output: {output.count('Traceback')}")
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())
    assert "Traceback" not in output, output[-3000:]
