"""One request to an ASGI app in process, for tests of the guard and the router."""

from __future__ import annotations

import asyncio


async def asgi_call(app, method: str, path: str, body: bytes = b"",
                    headers: dict[str, str] | None = None
                    ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request to the ASGI ``app``; the client never leaves
    (a JSON body gets its content-length and content-type)."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body:
        raw += [(b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json")]
    scope = {"type": "http", "method": method, "path": path, "headers": raw,
             "query_string": b""}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))
