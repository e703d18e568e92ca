"""POST /v1/messages and /v1/messages/count_tokens as plain ASGI, in front of the other routes
(as `generation_routes` does for the OpenAI endpoints: the same body reading, admission and
disconnect handling), answering errors in Anthropic's shape. Any other path goes to ``app``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from radixserve.server.admission import AdmissionGate, Ticket
from radixserve.server.errors import send_json
from radixserve.server.generation_routes import (
    _SSE_HEADERS, _parse, _read_body, _until_disconnect, _wait_disconnect)
from radixserve.server.protocol_anthropic import CountTokensRequest, MessagesRequest
from radixserve.server.serving import ClientDisconnected, OpenAIError, ServingContext
from radixserve.server.anthropic_blocks import MESSAGE_STOP
from radixserve.server.serving_anthropic import (
    MessagesServer, send_anthropic_error, stream_error_event)


class AnthropicRoutes:
    def __init__(self, app, ctx: ServingContext, gate: AdmissionGate) -> None:
        self.app, self.ctx, self.gate = app, ctx, gate
        self.messages = MessagesServer(ctx)
        self.routes = {"/v1/messages": self._messages,
                       "/v1/messages/count_tokens": self._count_tokens}

    async def __call__(self, scope, receive, send) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None:
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            return await send_anthropic_error(send, OpenAIError(
                f"method {scope['method']} not allowed on {scope['path']}", 405))
        admitted: list[Ticket] = []
        try:
            try:
                whole, chunks = await handler(await _read_body(receive), receive, admitted)
            except Exception as exc:  # noqa: BLE001 - every error is answered with a body
                return await send_anthropic_error(send, exc)
            if chunks is not None:
                return await _stream(chunks, receive, send)
            return await send_json(send, 200, whole)
        finally:
            for ticket in admitted:
                ticket.release()

    async def _messages(self, raw: bytes, receive, admitted: list):
        arrival = time.time()
        body = _parse(MessagesRequest, raw)
        self.gate.precheck(1, 0)
        ids, params, tool_parser = await self.messages.prepare(body)
        await self.ctx.check_structured("tool_choice", [params])
        self.ctx.check_alive()
        ticket = self.gate.admit(1, len(ids))
        admitted.append(ticket)
        if body.stream:
            return None, self.messages.stream(ids, params, tool_parser, arrival, ticket)
        work = self.messages.full(ids, params, tool_parser, arrival, ticket)
        return await _until_disconnect(receive, work), None

    async def _count_tokens(self, raw: bytes, receive, admitted: list):
        return await self.messages.count_tokens(_parse(CountTokensRequest, raw)), None


async def _stream(chunks: AsyncIterator[str], receive, send) -> None:
    """Send ``chunks`` as SSE; stop (closing ``chunks``, which aborts the engine request) when
    the client leaves. A failure after the response started ends it with an ``error`` event."""
    this = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _wait_disconnect(receive)
        gone = True
        this.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        try:
            async for chunk in chunks:
                # the chunk carrying message_stop also ends the response: one write, not two
                last = chunk.endswith(MESSAGE_STOP)
                await send({"type": "http.response.body", "body": chunk.encode(),
                            "more_body": not last})
                if last:
                    return
        except (ClientDisconnected, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the engine's and queue errors, as an event
            await send({"type": "http.response.body", "body": stream_error_event(exc).encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not gone:
            raise  # the server is stopping, not the client leaving
        this.uncancel()
    finally:
        watcher.cancel()
        await asyncio.shield(chunks.aclose())
