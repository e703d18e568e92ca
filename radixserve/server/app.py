"""The OpenAI-compatible server's ASGI app: the API-key and body-size guard, then the two
generation endpoints and the render endpoint as plain ASGI (`generation_routes`), then FastAPI
for every other route (models, tokenize, health, metrics). Handlers live in serving_*.py."""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from radixserve import __version__
from radixserve.engine.core_client import EngineDeadError
from radixserve.server.content_type import unsupported_media_type
from radixserve.server.errors import error_response, send_error
from radixserve.server.generation_routes import GenerationRoutes
from radixserve.server.metrics import ServerMetrics
from radixserve.server.openapi_routes import describe_generation_routes
from radixserve.server.protocol import ModelCard, ModelList, error_body
from radixserve.server.protocol_chat import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from radixserve.server.serving import OpenAIError, ServingContext
from radixserve.server.serving_chat import render_messages

_OPEN_PATHS = {"/health", "/version", "/metrics"}


def build_app(ctx: ServingContext, metrics: ServerMetrics, api_key: str | None = None,
              max_body_bytes: int = 32 * 1024 * 1024):
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
        s = client.stats
        return {"num_requests_running": s.num_running, "num_requests_waiting": s.num_waiting,
                "kv_cache_usage": s.kv_usage, "num_kv_blocks": s.num_kv_blocks,
                "num_pending_requests": len(client.queues)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=ctx.model_name, max_model_len=ctx.max_model_len)])

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        if body.messages is not None:
            text = render_messages(ctx, body)
        else:
            text = body.prompt
        ids = ctx.tokenizer.encode(text, add_special_tokens=body.effective_add_special_tokens)
        strs = ctx.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids,
                                token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        if any(t >= ctx.tokenizer.vocab_size for t in body.tokens):
            raise OpenAIError("token ids are out of the vocabulary", param="tokens")
        return DetokenizeResponse(prompt=ctx.tokenizer.decode(body.tokens,
                                                              skip_special_tokens=False))

    describe_generation_routes(app)
    return _Guard(GenerationRoutes(app, ctx), api_key, max_body_bytes)


class _Guard:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from streams):
    rejects oversized bodies (413), with an API key unauthenticated requests (401), and POST
    bodies that are not JSON (415, `content_type`)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await send_error(send, OpenAIError(
                f"request body too large ({int(length)} bytes; limit {self.max_body_bytes})",
                413))
        if self.expected is not None and scope["path"] not in _OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                return await send_error(send, OpenAIError(
                    "invalid or missing API key", 401, "authentication_error",
                    code="invalid_api_key"))
        if (refusal := unsupported_media_type(scope["method"], headers)) is not None:
            return await send_error(send, refusal)
        if length.isdigit():
            return await self.app(scope, receive, send)
        return await self._counted(scope, receive, send)

    async def _counted(self, scope, receive, send):
        """A body without Content-Length (chunked): count it as it arrives."""
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise OpenAIError(f"request body too large (limit {self.max_body_bytes} "
                                      "bytes)", 413)
            return message

        await self.app(scope, counting_receive, send)


def _error(message: str, status: int, type: str = "invalid_request_error",
           param: str | None = None, code=None) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


def _install_errors(app: FastAPI) -> None:
    async def answer(request, exc):
        status, body = error_response(exc)
        return JSONResponse(body, status_code=status) if body else Response(status_code=status)

    for kind in (RequestValidationError, HTTPException, OpenAIError, ValueError,
                 EngineDeadError, Exception):
        app.add_exception_handler(kind, answer)

    @app.exception_handler(404)
    async def on_404(request, exc):
        return _error(f"no route {request.method} {request.url.path}", 404, "not_found")

    @app.exception_handler(405)
    async def on_405(request, exc):
        return _error(f"method {request.method} not allowed on {request.url.path}", 405)
