"""The Responses API's entries in the route table: ``POST /v1/responses`` (OpenAI error bodies;
a stream of typed events, not closed by ``[DONE]``), and GET / DELETE of stored responses and
their input items."""

from __future__ import annotations

import dataclasses
import time

import msgspec

from radixserve.frontend.http.asgi_io import until_disconnect
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import Call, Route
from radixserve.frontend.openai.routes import OpenAIRoutes
from radixserve.frontend.responses.protocol import InputItemsQuery, ResponsesRequest
from radixserve.frontend.responses.serving import ResponsesServer
from radixserve.frontend.truncation import say_truncated


class ResponsesRoutes:
    def __init__(self, openai: OpenAIRoutes) -> None:
        self.ctx, self.gate = openai.ctx, openai.gate
        self.store = openai.ctx.response_store
        self.responses = ResponsesServer(openai.ctx, openai.chat)
        self.wire = dataclasses.replace(openai.wire, tail=b"", ends=None,
                                        stream_doc="with stream: true, typed server-sent events")

    def routes(self) -> list[Route]:
        w, stored = self.wire, "/v1/responses/{response_id}"
        return [
            Route("POST", "/v1/responses", self.create, w, "OpenAI Responses (typed server-sent "
                  "events when streamed)", ResponsesRequest, can_stream=True),
            Route("GET", stored, self.retrieve, w, "A stored response"),
            Route("DELETE", stored, self.delete, w, "Delete a stored response"),
            Route("GET", stored + "/input_items", self.input_items, w,
                  "A stored response's input items", query=InputItemsQuery),
        ]

    async def create(self, call: Call):
        arrival = time.time()
        body = parse_body(ResponsesRequest, call.body)
        self.gate.precheck(1, 0)
        plan = await self.responses.prepare(body)
        say_truncated(call.headers, plan.parsers.truncation)
        await self.ctx.check_structured(format_param(body), [plan.params])
        self.ctx.check_alive()
        ticket = self.gate.admit(1, len(plan.ids), None)
        call.admitted.append(ticket)
        if body.stream:
            return self.responses.stream(plan, arrival, ticket)
        return await until_disconnect(call.receive, self.responses.full(plan, arrival, ticket))

    async def retrieve(self, call: Call):
        response_id = call.path_params["response_id"]
        return msgspec.json.encode(_found(response_id, await self.store.get(response_id)))

    async def delete(self, call: Call):
        response_id = call.path_params["response_id"]
        if not await self.store.delete(response_id):
            _not_found(response_id)
        return msgspec.json.encode({"id": response_id, "object": "response", "deleted": True})

    async def input_items(self, call: Call):
        """OpenAI's list: ``order`` desc (newest first) by default, ``after`` an item id."""
        response_id = call.path_params["response_id"]
        query = InputItemsQuery.model_validate(call.query)
        limit, order, after = query.limit, query.order, query.after
        items = _found(response_id, await self.store.input_items(response_id))
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise OpenAIError(f"no input item with id {after!r} in response "
                                  f"{response_id!r}", param="after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return msgspec.json.encode({"object": "list", "data": page,
                                    "first_id": page[0]["id"] if page else None,
                                    "last_id": page[-1]["id"] if page else None,
                                    "has_more": len(items) > limit})


def format_param(body: ResponsesRequest) -> str:
    """The field a structured-output error is about."""
    return "text.format" if body.format().type != "text" else "tool_choice"


def _found(response_id: str, value):
    if value is None:
        _not_found(response_id)
    return value


def _not_found(response_id: str):
    raise OpenAIError(f"No response found with id '{response_id}'.", 404, param="response_id",
                      code="response_not_found")
