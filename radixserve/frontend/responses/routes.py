"""GET and DELETE of stored responses, and their input items, on the FastAPI app."""

from __future__ import annotations

import msgspec
from fastapi import FastAPI
from fastapi.responses import Response

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.serving import ServingContext

MAX_LIST_LIMIT = 100


def add_response_routes(app: FastAPI, ctx: ServingContext) -> None:
    store = ctx.response_store

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str):
        return _json(_found(response_id, await store.get(response_id)))

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str):
        if not await store.delete(response_id):
            _not_found(response_id)
        return _json({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, limit: int = 20, order: str = "desc",
                          after: str | None = None):
        """OpenAI's list: ``order`` desc (newest first) by default, ``after`` an item id."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise OpenAIError(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}",
                              param="limit")
        if order not in ("asc", "desc"):
            raise OpenAIError(f"order must be 'asc' or 'desc', got {order!r}", param="order")
        items = _found(response_id, await store.input_items(response_id))
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise OpenAIError(f"no input item with id {after!r} in response "
                                  f"{response_id!r}", param="after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return _json({"object": "list", "data": page,
                      "first_id": page[0]["id"] if page else None,
                      "last_id": page[-1]["id"] if page else None,
                      "has_more": len(items) > limit})


def _found(response_id: str, value):
    if value is None:
        _not_found(response_id)
    return value


def _not_found(response_id: str):
    raise OpenAIError(f"No response found with id '{response_id}'.", 404, param="response_id",
                      code="response_not_found")


def _json(obj) -> Response:
    return Response(msgspec.json.encode(obj), media_type="application/json")
