"""The Anthropic Messages API's entries in the route table: ``POST /v1/messages`` and
``/v1/messages/count_tokens``, answering errors (the guard's refusals included) in
Anthropic's shape and streams as its events, closed by ``message_stop``."""

from __future__ import annotations

import time

from radixserve.frontend.anthropic.blocks import MESSAGE_STOP
from radixserve.frontend.anthropic.protocol import (AnthropicErrorBody, CountTokensRequest,
                                                    MessagesRequest)
from radixserve.frontend.anthropic.serving import (MessagesServer, send_anthropic_error,
                                                   stream_error_event)
from radixserve.frontend.http.admission import AdmissionGate
from radixserve.frontend.http.asgi_io import SSE_HEADERS, until_disconnect
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.router import Call, Route, Wire
from radixserve.frontend.openai.serving import ServingContext

ANTHROPIC = Wire(send_anthropic_error, send_anthropic_error, SSE_HEADERS,
                 lambda exc: stream_error_event(exc).encode(), ends=MESSAGE_STOP.encode(),
                 stream_doc="with stream: true, Anthropic's server-sent events",
                 error_model=AnthropicErrorBody)


class AnthropicRoutes:
    def __init__(self, ctx: ServingContext, gate: AdmissionGate) -> None:
        self.ctx, self.gate = ctx, gate
        self.messages = MessagesServer(ctx)

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/messages", self.create, ANTHROPIC, "Anthropic Messages (its "
                  "error shape on this route)", MessagesRequest, can_stream=True),
            Route("POST", "/v1/messages/count_tokens", self.count_tokens, ANTHROPIC,
                  "Anthropic token count", CountTokensRequest),
        ]

    async def create(self, call: Call):
        arrival = time.time()
        body = parse_body(MessagesRequest, call.body)
        self.gate.precheck(1, 0)
        ids, params, parsers = await self.messages.prepare(body)
        await self.ctx.check_structured("tool_choice", [params])
        self.ctx.check_alive()
        ticket = self.gate.admit(1, len(ids))
        call.admitted.append(ticket)
        if body.stream:
            return self.messages.stream(ids, params, parsers, arrival, ticket, body)
        work = self.messages.full(ids, params, parsers, arrival, ticket, body)
        return await until_disconnect(call.receive, work)

    async def count_tokens(self, call: Call):
        return await self.messages.count_tokens(parse_body(CountTokensRequest, call.body))
