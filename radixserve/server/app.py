"""FastAPI routes of the OpenAI-compatible server (handlers live in serving_*.py)."""

from __future__ import annotations

import asyncio
import hmac
import time

import msgspec
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixserve import __version__
from radixserve.engine.async_engine import EngineRequestError
from radixserve.engine.core_client import EngineDeadError
from radixserve.server.metrics import ServerMetrics
from radixserve.server.protocol import (
    CompletionRequest,
    ModelCard,
    ModelList,
    error_body,
    validation_error_body,
    value_error_body,
)
from radixserve.server.protocol_chat import (
    ChatCompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from radixserve.server.serving import (
    ClientDisconnected,
    OpenAIError,
    ServingContext,
    until_disconnect,
    wait_disconnect,
)
from radixserve.server.serving_chat import ChatServer, render_messages
from radixserve.server.serving_completion import CompletionServer

_OPEN_PATHS = {"/health", "/version", "/metrics"}


def build_app(ctx: ServingContext, metrics: ServerMetrics, api_key: str | None = None,
              max_body_bytes: int = 32 * 1024 * 1024) -> FastAPI:
    app = FastAPI(title="radixserve", version=__version__)
    completions, chat = CompletionServer(ctx), ChatServer(ctx)
    client = ctx.engine.client
    _install_errors(app)

    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes)

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

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        arrival = time.time()
        prompts, params = await completions.prepare(body)
        await ctx.check_structured(_structured_param(body), params)
        _check_alive(client)
        if body.stream:
            return _stream(completions.stream(body, prompts, params, arrival), request)
        return await until_disconnect(request, completions.full(body, prompts, params, arrival))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        arrival = time.time()
        ids, params, tool_parser = chat.prepare(body)
        await ctx.check_structured(_structured_param(body), [params])
        _check_alive(client)
        if body.stream:
            return _stream(chat.stream(body, ids, params, tool_parser, arrival), request)
        return await until_disconnect(request,
                                      chat.full(body, ids, params, tool_parser, arrival))

    @app.post("/v1/chat/completions/render")
    async def render_chat(body: ChatCompletionRequest):
        ctx.check_model(body.model)
        text = render_messages(ctx, body)
        ids = ctx.tokenizer.encode_prompt(text)
        # msgspec, not FastAPI's encoder, which walks the id list element by element
        return Response(msgspec.json.encode({"prompt": text, "prompt_token_ids": ids,
                                             "count": len(ids)}),
                        media_type="application/json")

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

    return app


class _Guard:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from streams):
    rejects oversized bodies (413) and, with an API key, unauthenticated requests (401)."""

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
            response = _error(f"request body too large ({int(length)} bytes; limit "
                              f"{self.max_body_bytes})", 413)
            return await response(scope, receive, send)
        if self.expected is not None and scope["path"] not in _OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error("invalid or missing API key", 401, "authentication_error",
                                  code="invalid_api_key")
                return await response(scope, receive, send)
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
                    raise HTTPException(413, f"request body too large (limit "
                                             f"{self.max_body_bytes} bytes)")
            return message

        await self.app(scope, counting_receive, send)





def _stream(chunks, request: Request) -> StreamingResponse:
    """SSE response that stops (aborting the engine requests) as soon as the client leaves,
    whether or not the ASGI server reports the disconnect on send."""

    async def guarded():
        watcher = asyncio.ensure_future(wait_disconnect(request))
        step = None
        try:
            while True:
                step = asyncio.ensure_future(chunks.__anext__())
                await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    return  # client gone
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    return
                yield chunk
        except EngineDeadError as exc:
            body = error_body(f"engine unavailable: {exc}", "service_unavailable", code=503)
            yield f"data: {_json(body)}\n\n"
        except EngineRequestError as exc:
            yield f"data: {_json(error_body(str(exc)))}\n\n"
        finally:
            # NOTE: a separate task: when the server cancels this response (client gone), every
            # await here would be cancelled again before the engine requests are aborted.
            watcher.cancel()
            asyncio.ensure_future(_close(step, chunks))

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _structured_param(body) -> str:
    """The request field a structured-output error is about."""
    if getattr(body, "response_format", None) is not None:
        return "response_format"
    if getattr(body, "structured_outputs", None) is not None:
        return "structured_outputs"
    return "tool_choice"


def _check_alive(client) -> None:
    """Answer 503 up front (not a 200 stream carrying an error) when the engine is gone."""
    if client.dead:
        raise EngineDeadError(client.dead)


async def _close(step: asyncio.Future | None, chunks) -> None:
    """Stop a response's generator: cancel its pending step (which aborts its engine
    requests on the way out), then close it."""
    if step is not None and not step.done():
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
    await chunks.aclose()


def _json(obj) -> str:
    import json
    return json.dumps(obj)


def _error(message: str, status: int, type: str = "invalid_request_error",
           param: str | None = None, code=None) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_validation(request, exc):
        return JSONResponse(validation_error_body(exc), status_code=400)

    @app.exception_handler(OpenAIError)
    async def on_openai(request, exc: OpenAIError):
        return _error(exc.message, exc.status, exc.type, exc.param, exc.code)

    @app.exception_handler(ValueError)
    async def on_value(request, exc: ValueError):
        return JSONResponse(value_error_body(exc), status_code=400)

    @app.exception_handler(EngineDeadError)
    async def on_dead(request, exc):
        return _error(f"engine unavailable: {exc}", 503, "service_unavailable")

    @app.exception_handler(ClientDisconnected)
    async def on_disconnect(request, exc):
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def on_internal(request, exc):
        return _error(f"internal error: {type(exc).__name__}: {exc}", 500, "internal_error")

    @app.exception_handler(413)
    async def on_413(request, exc):
        return _error(str(exc.detail), 413)

    @app.exception_handler(404)
    async def on_404(request, exc):
        return _error(f"no route {request.method} {request.url.path}", 404, "not_found")

    @app.exception_handler(405)
    async def on_405(request, exc):
        return _error(f"method {request.method} not allowed on {request.url.path}", 405)
