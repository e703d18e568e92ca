"""The guard and router without a server: a 405 names the path's methods in ``Allow``; the API
key is checked before the body's size (an unauthenticated oversized request is a 401, not a
413); the drain's cut ends a handler with a 503 and a stream with its error event and
terminator (the end-to-end test over every API: test_drain.py)."""

from __future__ import annotations

import asyncio
import json

from asgi_call import asgi_call

from radixserve.frontend.app import Guard
from radixserve.frontend.http.router import OPENAI, Call, Route, Router

KEY = "k"
MAX_BYTES = 100


async def _ok(call: Call):
    return b"{}"


def _app(*routes: Route, api_key: str | None = None) -> Guard:
    return Guard(Router(list(routes)), api_key, MAX_BYTES)


_call = asgi_call


def test_405_lists_the_paths_methods_in_allow():
    app = _app(Route("POST", "/v1/x", _ok, OPENAI), Route("GET", "/r/{id}", _ok, OPENAI),
               Route("DELETE", "/r/{id}", _ok, OPENAI))
    status, headers, body = asyncio.run(_call(app, "GET", "/v1/x"))
    assert status == 405 and headers["allow"] == "POST"
    assert json.loads(body)["error"]["message"] == "method GET not allowed on /v1/x"
    status, headers, _ = asyncio.run(_call(app, "POST", "/r/7", b"{}"))
    assert status == 405 and headers["allow"] == "DELETE, GET, HEAD"
    status, headers, _ = asyncio.run(_call(app, "GET", "/nowhere"))
    assert status == 404 and "allow" not in headers


def test_the_api_key_is_checked_before_the_body_size():
    app = _app(Route("POST", "/v1/x", _ok, OPENAI), api_key=KEY)
    big = b"[" + b"0," * MAX_BYTES + b"0]"
    status, headers, body = asyncio.run(_call(app, "POST", "/v1/x", big))
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert headers["connection"] == "close"  # its body was never read
    auth = {"Authorization": f"Bearer {KEY}"}
    status, headers, body = asyncio.run(_call(app, "POST", "/v1/x", big, auth))
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert asyncio.run(_call(app, "POST", "/v1/x", b"{}", auth))[0] == 200
    status, headers, _ = asyncio.run(_call(app, "GET", "/v1/x"))  # no body: kept open
    assert status == 401 and "connection" not in headers


def _drained(route: Route, started: asyncio.Event) -> tuple[int, dict[str, str], bytes]:
    """The answer to ``route``'s request when the drain expires once ``started`` is set."""
    router = Router([route])

    async def main():
        call = asyncio.ensure_future(_call(router, "POST", route.path, b"{}"))
        await started.wait()
        router.drain.expire()
        return await call

    return asyncio.run(main())


def test_the_drain_ends_a_waiting_handler_with_a_503():
    started = asyncio.Event()

    async def slow(call: Call):
        started.set()
        await asyncio.Event().wait()

    status, _, body = _drained(Route("POST", "/v1/x", slow, OPENAI), started)
    error = json.loads(body)["error"]
    assert status == 503 and error["code"] == "server_shutting_down"


def test_the_drain_ends_a_stream_with_its_error_event_and_done():
    started, closed = asyncio.Event(), []

    async def endless():
        try:
            yield 'data: {"n": 1}\n\n'
            started.set()
            await asyncio.Event().wait()  # the engine still working at the deadline
        finally:
            closed.append(True)

    async def stream(call: Call):
        return endless()

    status, _, body = _drained(Route("POST", "/v1/x", stream, OPENAI), started)
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[0] == '{"n": 1}' and events[-1] == "[DONE]"
    assert json.loads(events[1])["error"]["code"] == "server_shutting_down"
    assert len(events) == 3 and closed == [True]
