"""POST /v1/messages and /v1/messages/count_tokens as plain ASGI, in front of the other routes
(as `generation_routes` does for the OpenAI endpoints: the same body reading, admission and
disconnect handling), answering errors in Anthropic's shape. Any other path goes to ``app``."""

from __future__ import annotations

import time

from radixserve.frontend.http.admission import AdmissionGate, Ticket
from radixserve.frontend.http.asgi_io import SSE_HEADERS, read_body, send_stream, until_disconnect
from radixserve.frontend.http.errors import send_json
from radixserve.frontend.openai.routes import _parse
from radixserve.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.anthropic.blocks import MESSAGE_STOP
from radixserve.frontend.anthropic.serving import (
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
                whole, chunks = await handler(await read_body(receive), receive, admitted)
            except Exception as exc:  # noqa: BLE001 - every error is answered with a body
                return await send_anthropic_error(send, exc)
            if chunks is not None:
                return await send_stream(chunks, receive, send, SSE_HEADERS,
                                         lambda exc: stream_error_event(exc).encode(),
                                         ends=MESSAGE_STOP.encode())
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
        return await until_disconnect(receive, work), None

    async def _count_tokens(self, raw: bytes, receive, admitted: list):
        return await self.messages.count_tokens(_parse(CountTokensRequest, raw)), None
