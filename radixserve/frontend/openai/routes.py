"""POST /v1/completions, /v1/chat/completions and /v1/chat/completions/render as plain ASGI,
in front of the FastAPI app.

The generation endpoints carry nearly all of a server's traffic, and a streamed response sends
a chunk per engine step (render, the chat template alone, is benchmarked on its own). Through FastAPI a request crossed about ten middleware and routing layers and
each chunk five ``send`` wrappers plus a task and an ``asyncio.wait`` for disconnect
detection; measured with the mock engine that was a third of the API process. Here a request
is: read the body, validate it with the same pydantic model, run the same handler, send the
chunks; one watcher task per request cancels the response when the client leaves (which
aborts its engine requests). Errors get the same OpenAI bodies as every other route
(`errors.error_response`). Every other path and method goes to the FastAPI app behind.
"""

from __future__ import annotations

import json
import time

import msgspec
from pydantic import BaseModel

from radixserve.frontend.async_llm import EngineRequestError, EngineStepError
from radixserve.frontend.core_client import EngineDeadError
from radixserve.frontend.http.admission import AdmissionGate, AdmissionLimits, Ticket
from radixserve.frontend.http.admission_metrics import NoAdmissionMetrics
from radixserve.frontend.http.asgi_io import SSE_HEADERS, read_body, send_stream, until_disconnect
from radixserve.frontend.http.errors import error_response, send_error, send_json
from radixserve.frontend.openai.protocol import CompletionRequest
from radixserve.frontend.http.protocol_base import error_body
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.protocol_embedding import EmbeddingRequest
from radixserve.frontend.responses.protocol import ResponsesRequest, format_param
from radixserve.frontend.openai.serving import SSE_DONE, ServingContext
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.serving_chat import ChatServer, render_messages
from radixserve.frontend.http.worker_routes import rendered_prompt
from radixserve.frontend.openai.serving_completion import CompletionServer, request_size
from radixserve.frontend.openai.serving_embedding import EmbeddingServer
from radixserve.frontend.responses.serving import ResponsesServer

class GenerationRoutes:
    """ASGI app: the generation and render endpoints; any other path goes to ``app``."""

    def __init__(self, app, ctx: ServingContext, gate: AdmissionGate | None = None) -> None:
        self.app = app
        self.ctx = ctx
        self.gate = gate or AdmissionGate(AdmissionLimits(None, None, None),
                                          NoAdmissionMetrics())
        self.completions, self.chat = CompletionServer(ctx), ChatServer(ctx)
        self.embeddings = EmbeddingServer(ctx)
        self.responses = ResponsesServer(ctx, self.chat)
        self.routes = {"/v1/completions": self._completion,
                       "/v1/chat/completions": self._chat_completion,
                       "/v1/chat/completions/render": self._render,
                       "/v1/completions/render": self._render_completion,
                       "/v1/embeddings": self._embeddings,
                       "/v1/responses": self._response}
        # the SSE terminator of a route's stream (Responses streams end without [DONE])
        self.stream_ends = {"/v1/responses": ""}

    async def __call__(self, scope, receive, send) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None:
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            return await send_error(send, OpenAIError(
                f"method {scope['method']} not allowed on {scope['path']}", 405))
        admitted: list[Ticket] = []  # released on every exit path, the stream's end included
        try:
            try:
                # a response: (the whole JSON body, None) or (None, the SSE chunks)
                whole, chunks = await handler(await read_body(receive), receive, admitted)
            except Exception as exc:  # noqa: BLE001 - every error is answered with a body
                self._count_refusal(exc)
                return await send_error(send, exc)
            if chunks is not None:
                # after an error event too: clients stop reading at [DONE]
                done = self.stream_ends.get(scope["path"], SSE_DONE).encode()
                return await send_stream(chunks, receive, send, SSE_HEADERS, _error_chunk,
                                         done, done or None)
            return await send_json(send, 200, whole)
        finally:
            for ticket in admitted:
                ticket.release()

    def _count_refusal(self, exc: Exception) -> None:
        if isinstance(exc, OpenAIError) and exc.code == "context_length_exceeded":
            self.gate.metrics.on_reject("context_length")

    async def _completion(self, raw: bytes, receive, admitted: list):
        arrival = time.time()
        body = _parse(CompletionRequest, raw)
        self.gate.precheck(*request_size(self.ctx, body))  # before tokenizing
        prompts, params = await self.completions.prepare(body)
        await self.ctx.check_structured(structured_param(body), params)
        self.ctx.check_alive()
        ticket = self.gate.admit(len(prompts) * params[0].n, sum(len(ids) for _, ids in prompts),
                                 body.timeout)
        admitted.append(ticket)
        if body.stream:
            return None, self.completions.stream(body, prompts, params, arrival, ticket)
        work = self.completions.full(body, prompts, params, arrival, ticket)
        return (await until_disconnect(receive, work)).model_dump_json().encode(), None

    async def _chat_completion(self, raw: bytes, receive, admitted: list):
        arrival = time.time()
        body = _parse(ChatCompletionRequest, raw)
        self.gate.precheck(body.n or 1, 0)
        ids, params, tool_parser = await self.chat.prepare(body)
        await self.ctx.check_structured(structured_param(body), [params])
        self.ctx.check_alive()
        ticket = self.gate.admit(params.n, len(ids), body.timeout)
        admitted.append(ticket)
        if body.stream:
            return None, self.chat.stream(body, ids, params, tool_parser, arrival, ticket)
        work = self.chat.full(body, ids, params, tool_parser, arrival, ticket)
        return (await until_disconnect(receive, work)).model_dump_json().encode(), None

    async def _response(self, raw: bytes, receive, admitted: list):
        arrival = time.time()
        body = _parse(ResponsesRequest, raw)
        self.gate.precheck(1, 0)
        plan = await self.responses.prepare(body)
        await self.ctx.check_structured(format_param(body), [plan.params])
        self.ctx.check_alive()
        ticket = self.gate.admit(1, len(plan.ids), None)
        admitted.append(ticket)
        if body.stream:
            return None, self.responses.stream(plan, arrival, ticket)
        return await until_disconnect(receive, self.responses.full(plan, arrival, ticket)), None

    async def _embeddings(self, raw: bytes, receive, admitted: list):
        body = _parse(EmbeddingRequest, raw)
        work = self.embeddings.openai(body, self.admitter(admitted))
        return (await until_disconnect(receive, work)).model_dump_json().encode(), None

    def admitter(self, admitted: list):
        """``admit(num_seqs, num_tokens, timeout)`` through the gate, the ticket kept in
        ``admitted`` (released when the response ends)."""
        def admit(num_seqs: int, num_tokens: int, timeout: float | None):
            ticket = self.gate.admit(num_seqs, num_tokens, timeout)
            admitted.append(ticket)
            return ticket

        return admit

    async def _render(self, raw: bytes, receive, admitted: list):
        """The chat template and tokenization alone (no engine)."""
        body = _parse(ChatCompletionRequest, raw)
        self.ctx.check_model(body.model)
        text, ids = await self.ctx.prep.chat_prompt(lambda: render_messages(self.ctx, body))
        return msgspec.json.encode(rendered_prompt(self.ctx.model_name, text, ids)), None

    async def _render_completion(self, raw: bytes, receive, admitted: list):
        """The completion's prompts tokenized alone (no engine): one entry per prompt."""
        body = _parse(CompletionRequest, raw)
        prompts, _ = await self.completions.prepare(body)
        return msgspec.json.encode([rendered_prompt(self.ctx.model_name, text, ids)
                                    for text, ids in prompts]), None


def structured_param(body) -> str:
    """The request field a structured-output error is about."""
    if getattr(body, "response_format", None) is not None:
        return "response_format"
    if getattr(body, "structured_outputs", None) is not None:
        return "structured_outputs"
    return "tool_choice"


def _parse(model: type[BaseModel], raw: bytes):
    if not raw.strip():
        raise OpenAIError("Missing request body")
    return model.model_validate_json(raw)


def _error_chunk(exc: Exception) -> bytes | None:
    """An engine error after the stream started, as a last ``data:`` event carrying an error
    body (any other exception, a bug, the event `errors.error_response` describes)."""
    if isinstance(exc, EngineDeadError):
        body = error_body(f"engine unavailable: {exc}", "service_unavailable", code=503)
    elif isinstance(exc, EngineStepError):
        body = error_body(str(exc), "internal_error", code=500)
    elif isinstance(exc, EngineRequestError):
        body = error_body(str(exc))
    elif isinstance(exc, OpenAIError):  # e.g. a queue timeout before the first token
        body = error_body(exc.message, exc.type, exc.param, exc.code)
    else:
        body = error_response(exc)[1]
    return None if body is None else f"data: {json.dumps(body)}\n\n".encode()
