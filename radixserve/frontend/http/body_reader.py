"""Reading a request body under limits, before any route sees it.

A body is read whole by the guard in front of every route (they all parse it whole anyway),
under ``--max-request-bytes`` (checked from Content-Length first, then while reading, so a
chunked or lying body is cut as soon as it passes the limit) and ``--body-read-timeout`` (one
deadline for the whole body, so a client sending a byte now and then cannot hold a connection).
Errors are OpenAI error bodies, sent with ``Connection: close``: the rest of the body is never
read. The app then gets the body as one message, and the client's later messages
(``http.disconnect``) as they come.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from radixserve.frontend.http.protocol_base import ClientDisconnected, OpenAIError


class BodyRefused(OpenAIError):
    """413 or 408; the connection is closed after the answer."""

    close_connection = True

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message, status, "invalid_request_error",
                         code="request_too_large" if status == 413 else "request_timeout")
        self.reason = reason  # for the rejection counter


def has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"chunked" in headers.get(b"transfer-encoding", b"").lower()


def check_declared_length(headers: dict[bytes, bytes], max_bytes: int) -> None:
    length = headers.get(b"content-length", b"")
    if length.isdigit() and int(length) > max_bytes:
        raise BodyRefused(f"request body too large ({int(length)} bytes; limit {max_bytes}, "
                          f"--max-request-bytes)", 413, "body_too_large")


async def read_body(receive, max_bytes: int, timeout: float | None) -> bytes:
    """The whole body; BodyRefused past ``max_bytes`` or ``timeout`` seconds,
    ClientDisconnected if the client leaves first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    parts, received = [], 0
    while True:
        if deadline is None:
            message = await receive()
        else:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise BodyRefused(f"the request body did not arrive within {timeout:g} s "
                                  f"(received {received} bytes; --body-read-timeout)", 408,
                                  "body_timeout") from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > max_bytes:
            raise BodyRefused(f"request body too large (more than {max_bytes} bytes, "
                              f"--max-request-bytes)", 413, "body_too_large")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def parse_body(model: type[BaseModel], raw: bytes, missing: str = "Missing request body"):
    """``raw`` validated into ``model`` (a ``ValidationError`` is a 400 naming the field); an
    empty body is a 400 saying ``missing``."""
    if not raw.strip():
        raise OpenAIError(missing)
    return model.model_validate_json(raw)


def replay(body: bytes, receive):
    """An ASGI ``receive`` that gives ``body`` as one message, then defers to ``receive``."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
