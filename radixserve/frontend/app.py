"""The API process's ASGI app: the guard (API key, body size, content type: `http.guard`) in
front of one `Router` over one route table, which /openapi.json describes too. The table is
the server's own routes (health, version, load, metrics, the API description) and each API's
(`openai`, `responses`, `anthropic`, `ollama`), the browser pages (`ui`), what routers ask of
a worker (`http.worker_routes`) and the engine view's data (`http.engine_view`)."""

from __future__ import annotations

import msgspec
from starlette.responses import JSONResponse, Response

from radixserve import __version__
from radixserve.frontend.anthropic.routes import AnthropicRoutes
from radixserve.frontend.http.admission import AdmissionGate
from radixserve.frontend.http.engine_view import engine_view_routes
from radixserve.frontend.http.guard import Guard
from radixserve.frontend.http.limits import ServeLimits
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.http.openapi import openapi_schema
from radixserve.frontend.http.protocol_base import error_body
from radixserve.frontend.http.router import OPENAI, Call, Route, Router
from radixserve.frontend.http.worker_routes import worker_routes
from radixserve.frontend.ollama.routes import OllamaRoutes
from radixserve.frontend.openai.routes import OpenAIRoutes
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.responses.routes import ResponsesRoutes
from radixserve.frontend.ui.routes import ui_routes

_TITLE = "radixserve"


def build_app(ctx: ServingContext, metrics: ServerMetrics, api_key: str | None = None,
              limits: ServeLimits | None = None) -> Guard:
    limits = limits or ServeLimits()
    openai = OpenAIRoutes(ctx, AdmissionGate(limits.admission, metrics.admission))
    ollama = OllamaRoutes(openai)
    routes = [*server_routes(ctx, metrics), *openai.routes(), *ResponsesRoutes(openai).routes(),
              *AnthropicRoutes(ctx, openai.gate).routes(), *ollama.routes(),
              *ui_routes(ollama.running), *worker_routes(ctx), *engine_view_routes(ctx, metrics)]
    routes += description_routes(routes)
    return Guard(Router(routes), api_key, limits.max_request_bytes, limits.body_read_timeout,
                 metrics)


def server_routes(ctx: ServingContext, metrics: ServerMetrics) -> list[Route]:
    """Probes and the server's state: open without the API key, but /load."""
    client = ctx.engine.client

    async def health(call: Call):
        if client.dead:
            return JSONResponse(error_body(f"engine unavailable: {client.dead}",
                                           "service_unavailable"), 503)
        return Response(status_code=200)

    async def version(call: Call):
        return msgspec.json.encode({"version": __version__})

    async def load(call: Call):
        return msgspec.json.encode(client.load())  # summed over the replicas, then each one

    async def prometheus(call: Call):
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return [Route("GET", "/health", health, OPENAI, "200 while the engine is up", media=None,
                  is_open=True),
            Route("GET", "/version", version, OPENAI, "The server's version", is_open=True),
            Route("GET", "/load", load, OPENAI, "Requests and KV use, summed and per replica"),
            Route("GET", "/metrics", prometheus, OPENAI, "Prometheus metrics",
                  media="text/plain", is_open=True)]


def description_routes(routes: list[Route]) -> list[Route]:
    """/openapi.json of ``routes``, and the pages that browse it (/docs, /redoc)."""
    cached: list[bytes] = []  # built on first use

    async def schema(call: Call):
        if not cached:
            cached.append(msgspec.json.encode(openapi_schema(routes, _TITLE, __version__)))
        return cached[0]

    async def docs(call: Call):
        from fastapi.openapi.docs import get_swagger_ui_html

        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{_TITLE} - Swagger UI")

    async def redoc(call: Call):
        from fastapi.openapi.docs import get_redoc_html

        return get_redoc_html(openapi_url="/openapi.json", title=f"{_TITLE} - ReDoc")

    return [Route("GET", "/openapi.json", schema, OPENAI, in_schema=False),
            Route("GET", "/docs", docs, OPENAI, media="text/html", in_schema=False),
            Route("GET", "/redoc", redoc, OPENAI, media="text/html", in_schema=False)]
