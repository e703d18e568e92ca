"""The API process's ASGI app: the guard (Host, API key, body size, content type: `Guard`) in
front of one `Router` over one route table, which /openapi.json describes too. The table is
the server's own routes (health, version, load, metrics, the API description) and each API's
(`openai`, `responses`, `anthropic`, `ollama`, `llamacpp`), the browser pages (`ui`), what
routers ask of a worker (`http.worker_routes`) and the engine view's data (`http.engine_view`)."""

from __future__ import annotations

import hmac

import msgspec
from starlette.responses import JSONResponse, Response

from radixserve import __version__
from radixserve.frontend.anthropic.routes import AnthropicRoutes
from radixserve.frontend.http import body_reader, memory
from radixserve.frontend.http.admission import AdmissionGate
from radixserve.frontend.http.cache_routes import cache_routes
from radixserve.frontend.http.content_type import unsupported_media_type
from radixserve.frontend.http.engine_view import engine_view_routes
from radixserve.frontend.http.errors import send_error
from radixserve.frontend.http.host_check import HostPolicy
from radixserve.frontend.http.limits import ServeLimits
from radixserve.frontend.http.lora_routes import LoraUpdates, lora_routes
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.http.openapi import openapi_schema
from radixserve.frontend.http.protocol_base import ClientDisconnected, OpenAIError, error_body
from radixserve.frontend.http.router import OPENAI, Call, Route, Router
from radixserve.frontend.http.worker_routes import worker_routes
from radixserve.frontend.llamacpp.routes import LlamaCppRoutes
from radixserve.frontend.ollama.routes import OllamaRoutes
from radixserve.frontend.openai.routes import OpenAIRoutes
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.responses.routes import ResponsesRoutes
from radixserve.frontend.ui.routes import ui_routes

_TITLE = "radixserve"
_HEALTHY = b'{"status":"ok"}'


def build_app(ctx: ServingContext, metrics: ServerMetrics, api_key: str | None = None,
              limits: ServeLimits | None = None, hosts: HostPolicy | None = None,
              loras: LoraUpdates | None = None) -> Guard:
    """The single-model server's app; ``hosts``: the Host rule (`host_check`; None: any
    Host, for apps served in-process); ``loras``: run-time LoRA loads (None: their routes
    are not mounted)."""
    limits = limits or ServeLimits()
    openai = OpenAIRoutes(ctx, AdmissionGate(limits.admission, metrics.admission))
    ollama = OllamaRoutes(openai)
    routes = [*server_routes(ctx, metrics), *openai.routes(), *ResponsesRoutes(openai).routes(),
              *AnthropicRoutes(ctx, openai.gate).routes(), *ollama.routes(),
              *LlamaCppRoutes(openai).routes(),
              *ui_routes(ollama.running), *worker_routes(ctx), *engine_view_routes(ctx, metrics)]
    routes += cache_routes(ctx)
    routes += lora_routes(ctx, loras) if loras is not None else []
    routes += description_routes(routes)
    return Guard(Router(routes), api_key, limits.max_request_bytes, limits.body_read_timeout,
                 metrics, hosts)


def server_routes(ctx: ServingContext, metrics: ServerMetrics) -> list[Route]:
    """Probes and the server's state: open without the API key, but /load."""
    client = ctx.engine.client

    async def health(call: Call):
        # NOTE: "error" (the OpenAI shape) stays beside status and reason for the clients
        # that read it before those were added.
        if client.dead:
            return JSONResponse({"status": "unhealthy", "reason": client.dead,
                                 **error_body(f"engine unavailable: {client.dead}",
                                              "service_unavailable")}, 503)
        return _HEALTHY

    async def version(call: Call):
        return msgspec.json.encode({"version": __version__})

    async def load(call: Call):
        return msgspec.json.encode(client.load())  # summed over the replicas, then each one

    async def prometheus(call: Call):
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return [Route("GET", "/health", health, OPENAI,
                  '200 {"status": "ok"} while the engine is up and making progress; else 503 '
                  '{"status": "unhealthy", "reason": ...}: the engine died, hung '
                  "(--engine-stall-timeout) or is being restarted", is_open=True),
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


class Guard:
    """In front of every route (pure ASGI: BaseHTTPMiddleware would hide client
    disconnects from streams): rejects a Host header ``hosts`` does not allow (403, DNS
    rebinding: `host_check`), then, with an API key, requests without it (401) in
    ``Authorization: Bearer KEY`` or (as Anthropic's clients send it) ``x-api-key: KEY``; POST
    bodies that are not JSON (415, `content_type`); reads the body under its size and time limits
    (413, 408: `body_reader`) before any route sees it. The Host and the key are checked first: a
    request without them learns nothing of the limits; then the method (a 405 before a 415).
    Open without the key (``Route.is_open``): /health, /version, /metrics and the pages' static
    files. Refusals take the shape the route table gives the path (`Wire.send_refusal`)."""

    def __init__(self, router: Router, api_key: str | None, max_body_bytes: int,
                 body_timeout: float | None = None, metrics: ServerMetrics | None = None,
                 hosts: HostPolicy | None = None) -> None:
        self.router = router
        self.hosts = None if hosts is None or hosts.allows_any else hosts
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.router(scope, receive, send)
        headers = dict(scope["headers"])
        if self.hosts is not None and not self.hosts.allows(host := headers.get(b"host")):
            refusal = self.hosts.refusal(host)
            refusal.close_connection = body_reader.has_body(headers)  # its body unread
            return await self._send(scope, send, refusal)
        if self.expected is not None and not self.router.is_open(scope["path"]):
            given = (headers.get(b"authorization", b""),
                     b"Bearer " + headers.get(b"x-api-key", b""))
            if not any(hmac.compare_digest(key, self.expected) for key in given):
                refusal = OpenAIError("invalid or missing API key", 401, "authentication_error",
                                      code="invalid_api_key")
                refusal.close_connection = body_reader.has_body(headers)  # its body unread
                return await self._send(scope, send, refusal)
        if not self.router.serves(scope["method"], scope["path"]):
            return await self.router(scope, receive, send)  # its 404 or 405, the body unread
        try:
            body_reader.check_declared_length(headers, self.max_body_bytes)
        except body_reader.BodyRefused as exc:
            return await self._refuse(scope, send, exc)
        wire = self.router.wire_for(scope["path"])
        json_only = wire is None or wire.json_only
        if (refusal := unsupported_media_type(scope["method"], headers, json_only)) is not None:
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
