"""The guard in front of every route (pure ASGI: BaseHTTPMiddleware would hide client
disconnects from streams): with an API key, rejects requests without it (401) in
``Authorization: Bearer KEY`` or (as Anthropic's clients send it) ``x-api-key: KEY``; POST
bodies that are not JSON (415, `content_type`); reads the body under its size and time limits
(413, 408: `body_reader`) before any route sees it. Refusals take the shape the route table
gives the path (`Wire.send_refusal`)."""

from __future__ import annotations

import hmac

from radixserve.frontend.http import body_reader, memory
from radixserve.frontend.http.content_type import unsupported_media_type
from radixserve.frontend.http.errors import send_error
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.http.protocol_base import ClientDisconnected, OpenAIError
from radixserve.frontend.http.router import Router


class Guard:
    def __init__(self, router: Router, api_key: str | None, max_body_bytes: int,
                 body_timeout: float | None = None, metrics: ServerMetrics | None = None) -> None:
        self.router = router
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.router(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            body_reader.check_declared_length(headers, self.max_body_bytes)
        except body_reader.BodyRefused as exc:
            return await self._refuse(scope, send, exc)
        if self.expected is not None and not self.router.is_open(scope["path"]):
            given = (headers.get(b"authorization", b""),
                     b"Bearer " + headers.get(b"x-api-key", b""))
            if not any(hmac.compare_digest(key, self.expected) for key in given):
                return await self._send(scope, send, OpenAIError(
                    "invalid or missing API key", 401, "authentication_error",
                    code="invalid_api_key"))
        if (refusal := unsupported_media_type(scope["method"], headers)) is not None:
            return await self._send(scope, send, refusal)
        if not body_reader.has_body(headers):
            return await self.router(scope, receive, send)
        body = b""
        try:
            body = await body_reader.read_body(receive, self.max_body_bytes, self.body_timeout)
            await self.router(scope, body_reader.replay(body, receive), send)
        except body_reader.BodyRefused as exc:
            return await self._refuse(scope, send, exc)
        except ClientDisconnected:
            return None
        finally:
            if len(body) >= memory.TRIM_AFTER_BYTES:
                memory.trim_soon()

    async def _refuse(self, scope, send, exc: body_reader.BodyRefused) -> None:
        if self.metrics is not None:
            self.metrics.admission.on_reject(exc.reason)
        await self._send(scope, send, exc)

    async def _send(self, scope, send, exc: Exception) -> None:
        wire = self.router.wire_for(scope["path"])
        await (send_error if wire is None else wire.send_refusal)(send, exc)
