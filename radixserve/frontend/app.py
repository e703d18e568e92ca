"""The OpenAI-compatible server's ASGI app: the API-key and body-size guard, then the two
generation endpoints and the render endpoint as plain ASGI (`generation_routes`), then FastAPI
for every other route (models, tokenize, health, metrics, the engine state, the browser pages:
`engine_view`, `ui_routes`). Handlers live in serving_*.py."""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from radixserve import __version__
from radixserve.frontend.core_client import EngineDeadError
from radixserve.frontend.http import body_reader, memory
from radixserve.frontend.http.admission import AdmissionGate
from radixserve.frontend.anthropic.routes import AnthropicRoutes
from radixserve.frontend.http.content_type import unsupported_media_type
from radixserve.frontend.http.engine_view import install_engine_view
from radixserve.frontend.http.errors import error_headers, error_response, send_error
from radixserve.frontend.openai.routes import GenerationRoutes
from radixserve.frontend.http.limits import ServeLimits
from radixserve.frontend.ollama.routes import OllamaRoutes
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.http.openapi import describe_generation_routes
from radixserve.frontend.openai.protocol import ModelCard, ModelList
from radixserve.frontend.http.protocol_base import error_body
from radixserve.frontend.responses.routes import add_response_routes
from radixserve.frontend.openai.protocol_chat import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from radixserve.frontend.http.protocol_base import ClientDisconnected, OpenAIError
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.anthropic.serving import ANTHROPIC_PATHS, send_anthropic_error
from radixserve.frontend.openai.serving_chat import render_messages
from radixserve.frontend.ui.routes import UI_PAGES, UI_STATIC, install_ui
from radixserve.frontend.http.worker_routes import WORKER_PATHS, add_worker_routes

_OPEN_PATHS = {"/health", "/version", "/metrics", *WORKER_PATHS}


def build_app(ctx: ServingContext, metrics: ServerMetrics, api_key: str | None = None,
              limits: ServeLimits | None = None):
    limits = limits or ServeLimits()
    app = FastAPI(title="radixserve", version=__version__)
    client = ctx.engine.client
    _install_errors(app)

    @app.get("/health")
    async def health():
        if client.dead:
            return _error(f"engine unavailable: {client.dead}", 503, "service_unavailable")
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/load")
    async def load():
        return client.load()  # summed over the replicas, then each one

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=ctx.model_name, max_model_len=ctx.max_model_len)])

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        return await ctx.prep.run(_tokenize, ctx, body)  # grows with the input: off the loop

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        return await ctx.prep.run(_detokenize, ctx, body)

    describe_generation_routes(app)
    add_response_routes(app, ctx)
    install_engine_view(app, ctx, metrics)
    install_ui(app)
    add_worker_routes(app, ctx)
    gate = AdmissionGate(limits.admission, metrics.admission)
    routes = AnthropicRoutes(OllamaRoutes(GenerationRoutes(app, ctx, gate)), ctx, gate)
    return _Guard(routes, api_key, limits.max_request_bytes, limits.body_read_timeout, metrics)


def _tokenize(ctx: ServingContext, body: TokenizeRequest) -> Response:
    text = render_messages(ctx, body) if body.messages is not None else body.prompt
    # encode_batch releases the GIL while it runs (encode does not)
    ids = ctx.tokenizer.encode_batch([text], body.effective_add_special_tokens)[0]
    strs = ctx.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return _json(TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids,
                                  token_strs=strs))


def _detokenize(ctx: ServingContext, body: DetokenizeRequest) -> Response:
    if body.tokens and max(body.tokens) >= ctx.tokenizer.vocab_size:
        raise OpenAIError("token ids are out of the vocabulary", param="tokens")
    return _json(DetokenizeResponse(
        prompt=ctx.tokenizer.decode(body.tokens, skip_special_tokens=False)))


def _json(model) -> Response:
    """The response serialized here, on the worker thread: FastAPI would serialize a returned
    model on the event loop, item by item (seconds for a million token ids)."""
    return Response(model.model_dump_json(), media_type="application/json")


class _Guard:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from streams):
    with an API key, rejects requests without it (401) in ``Authorization: Bearer KEY`` or
    (as Anthropic's clients send it) ``x-api-key: KEY``; POST bodies that are not JSON (415,
    `content_type`); reads the body under its size and time limits (413, 408: `body_reader`)
    before any route sees it. Refusals take the error shape of the route asked for."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int,
                 body_timeout: float | None = None, metrics: ServerMetrics | None = None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            body_reader.check_declared_length(headers, self.max_body_bytes)
        except body_reader.BodyRefused as exc:
            return await self._refuse(scope, send, exc)
        if self.expected is not None and not _is_open(scope["path"]):
            given = (headers.get(b"authorization", b""),
                     b"Bearer " + headers.get(b"x-api-key", b""))
            if not any(hmac.compare_digest(key, self.expected) for key in given):
                return await _send_error(scope, send, OpenAIError(
                    "invalid or missing API key", 401, "authentication_error",
                    code="invalid_api_key"))
        if (refusal := unsupported_media_type(scope["method"], headers)) is not None:
            return await _send_error(scope, send, refusal)
        if not body_reader.has_body(headers):
            return await self.app(scope, receive, send)
        body = b""
        try:
            body = await body_reader.read_body(receive, self.max_body_bytes, self.body_timeout)
            await self.app(scope, body_reader.replay(body, receive), send)
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
        await _send_error(scope, send, exc)


async def _send_error(scope, send, exc: Exception) -> None:
    """The error in the shape of the route asked for (Anthropic's on its routes)."""
    if scope["path"] in ANTHROPIC_PATHS:
        return await send_anthropic_error(send, exc)
    return await send_error(send, exc)


def _is_open(path: str) -> bool:
    """Paths served without the API key: probes, and the pages (which hold no secret)."""
    return (path in _OPEN_PATHS or path in UI_PAGES
            or path.startswith(UI_STATIC) and ".." not in path)


def _error(message: str, status: int, type: str = "invalid_request_error",
           param: str | None = None, code=None) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


def _install_errors(app: FastAPI) -> None:
    async def answer(request, exc):
        status, body = error_response(exc)
        headers = {k.decode(): v.decode() for k, v in error_headers(exc)}
        return (JSONResponse(body, status_code=status, headers=headers) if body
                else Response(status_code=status, headers=headers))

    for kind in (RequestValidationError, HTTPException, OpenAIError, ValueError,
                 EngineDeadError, Exception):
        app.add_exception_handler(kind, answer)

    @app.exception_handler(404)
    async def on_404(request, exc):
        return _error(f"no route {request.method} {request.url.path}", 404, "not_found")

    @app.exception_handler(405)
    async def on_405(request, exc):
        return _error(f"method {request.method} not allowed on {request.url.path}", 405)
