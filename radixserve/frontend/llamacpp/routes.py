"""llama.cpp server's routes, for the editors written against it (llama.vscode, llama.vim):

    POST /infill    fill in the middle (code completion at a cursor); SSE when streamed

Errors on them are llama.cpp's ``{"error": {"code", "message", "type"}}`` with the status the
OpenAI routes would give. Bodies are read as JSON whatever their Content-Type, as llama.cpp
reads them (but from a browser: content_type.py).
"""

from __future__ import annotations

import time

import msgspec

from radixserve.frontend.http.asgi_io import SSE_HEADERS, until_disconnect
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.errors import error_headers, error_response, send_json
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import Call, Route, Wire
from radixserve.frontend.llamacpp.protocol import InfillError, InfillRequest
from radixserve.frontend.llamacpp.serving import Infill, infill_prompt, run_infill
from radixserve.frontend.openai.routes import OpenAIRoutes

_ENCODE = msgspec.json.encode


def _error(exc: Exception) -> tuple[int, bytes | None]:
    status, body = error_response(exc)
    if body is None:
        return status, None
    info = body["error"]
    return status, _ENCODE({"error": {"code": status, "message": info["message"],
                                      "type": info["type"]}})


async def send_llamacpp_error(send, exc: Exception) -> None:
    """llama.cpp's error body with the OpenAI routes' status."""
    status, body = _error(exc)
    if body is not None:
        await send_json(send, status, body, error_headers(exc))


def _error_event(exc: Exception) -> bytes | None:
    """An error after the stream started: a last ``data:`` event holding the error body."""
    body = _error(exc)[1]
    return None if body is None else b"data: " + body + b"\n\n"


LLAMACPP = Wire(send_llamacpp_error, send_llamacpp_error, SSE_HEADERS, _error_event,
                stream_doc="with stream: true, server-sent events: one data: line per piece "
                           "of text, the last with stop: true (no [DONE])",
                json_only=False, error_model=InfillError)


class LlamaCppRoutes:
    """llama.cpp's paths over the OpenAI routes' context and admission gate."""

    def __init__(self, openai: OpenAIRoutes) -> None:
        self.ctx, self.gate = openai.ctx, openai.gate

    def routes(self) -> list[Route]:
        return [Route("POST", "/infill", self.infill, LLAMACPP, "llama.cpp's fill in the "
                      "middle: input_prefix, input_suffix, input_extra, prompt",
                      InfillRequest, can_stream=True)]

    async def infill(self, call: Call):
        arrival = time.time()
        body = parse_body(InfillRequest, call.body)
        ctx = self.ctx
        ctx.check_model(body.model)
        for text, name in ((body.input_prefix, "input_prefix"),
                           (body.input_suffix, "input_suffix"), (body.prompt, "prompt")):
            ctx.prep.check_length(len(text), name)
        self.gate.precheck(1, 0)
        ids = await ctx.prep.run(infill_prompt, ctx, body)
        params = body.to_sampling_params()
        params.validate_vocab(ctx.tokenizer.vocab_size)
        room = ctx.max_model_len - len(ids)
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            raise OpenAIError(f"the infill prompt has {len(ids)} tokens and n_predict is "
                              f"{body.n_predict}: more than the context ({ctx.max_model_len} "
                              "tokens) holds", param="n_predict" if room >= 1 else "prompt",
                              code="context_length_exceeded")
        ctx.check_alive()
        ticket = self.gate.admit(1, len(ids), None)
        call.admitted.append(ticket)
        answer = run_infill(ctx, Infill(body, ids, arrival), params, ticket, body.stream)
        if body.stream:
            return answer
        return await until_disconnect(call.receive, _last(answer))


async def _last(chunks) -> bytes:
    """The one chunk of a whole (not streamed) answer."""
    out = b""
    async for chunk in chunks:
        out = chunk
    return out
