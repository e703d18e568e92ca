"""Ollama's API as entries of the route table, on top of the OpenAI handlers (/api/chat and
/api/generate run `OpenAIRoutes`'s own; see `serving`):

    GET  /api/version      the Ollama API version    POST /api/chat      chat, NDJSON stream
    GET  /api/tags         the served model          POST /api/generate  prompt, NDJSON stream
    GET  /api/ps           the model, while loaded   POST /api/embed     embeddings
    POST /api/show         the model's details       POST /api/embeddings (older form)

and ``GET /`` for its clients and probes ("Ollama is running"; a browser gets the playground:
`ui.routes`). Errors on these paths are Ollama's ``{"error": "message"}`` with the same status
the OpenAI routes would give; any other method or path under /api/ is a 404 listing these.
"""

from __future__ import annotations

import functools
import time

import msgspec
from starlette.responses import PlainTextResponse

from radixserve.frontend.http.asgi_io import until_disconnect
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.errors import error_headers, error_response, send_error, send_json
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import Call, Route, Wire
from radixserve.frontend.media.chat import TEXT_ONLY
from radixserve.frontend.ollama.models import OllamaModelInfo, read_model_info
from radixserve.frontend.ollama.protocol import (OllamaChatRequest, OllamaEmbedRequest,
                                                 OllamaErrorBody, OllamaGenerateRequest,
                                                 OllamaShowRequest)
from radixserve.frontend.ollama.serving import (Context, OllamaStreamError, Shape, check_model,
                                               collect, fim_prompt, stream, whole)
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.routes import OpenAIRoutes, capabilities
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.reasoning_budget import THINK_LEVEL_BUDGETS, can_budget

_NDJSON = [(b"content-type", b"application/x-ndjson")]
_ENCODE = msgspec.json.encode
_MISSING = "missing request body"


async def send_ollama_error(send, exc: Exception) -> None:
    """Ollama's error body, ``{"error": "message"}``, with the OpenAI routes' status."""
    status, body = error_response(exc)
    if body is None:
        return
    await send_json(send, status, _ENCODE({"error": body["error"]["message"]}),
                    error_headers(exc))


def _error_line(exc: Exception) -> bytes:
    """An error after the stream started, as a last ``{"error": ...}`` line."""
    if isinstance(exc, OllamaStreamError):
        return _error_bytes(str(exc))
    status, body = error_response(exc)
    return _error_bytes(body["error"]["message"] if body else str(exc))


def _error_bytes(message: str) -> bytes:
    return _ENCODE({"error": message}) + b"\n"


# The guard's refusals (401, 408, 413, 415) in Ollama's shape too; bodies read as JSON whatever
# their Content-Type, as Ollama does (its curl examples send form-urlencoded), except from a
# browser (an Origin header: content_type.py).
OLLAMA = Wire(send_ollama_error, send_ollama_error, _NDJSON, _error_line,
              stream_doc="with stream (the default), NDJSON lines", json_only=False,
              error_model=OllamaErrorBody)


OLLAMA_API_VERSION = "0.12.11"
"""What ``/api/version`` reports: the Ollama release whose API these routes follow (its
``think`` levels, ``logprobs``/``top_logprobs``, ``tool_name``; the fields of ollama-python
0.6). Clients gate features on it (a tools or thinking check refuses an old version), so
it is not radixserve's own version."""


class OllamaRoutes:
    """Ollama's paths, the generation ones through ``openai``'s handlers."""

    def __init__(self, openai: OpenAIRoutes) -> None:
        self.openai = openai
        self.ctx = openai.ctx

    def routes(self) -> list[Route]:
        table = [
            Route("GET", "/api/version", self._version, OLLAMA, "Ollama: the version"),
            Route("GET", "/api/tags", self._tags, OLLAMA, "Ollama: the models served"),
            Route("GET", "/api/ps", self._ps, OLLAMA, "Ollama: the models loaded"),
            Route("POST", "/api/show", self._show, OLLAMA, "Ollama model details",
                  OllamaShowRequest),
            Route("POST", "/api/chat", self._chat, OLLAMA, "Ollama chat (NDJSON lines when "
                  "streamed)", OllamaChatRequest, can_stream=True),
            Route("POST", "/api/generate", self._generate, OLLAMA, "Ollama generate (NDJSON "
                  "lines when streamed)", OllamaGenerateRequest, can_stream=True),
            Route("POST", "/api/embed", self._embed, OLLAMA, "Ollama embeddings",
                  OllamaEmbedRequest),
            Route("POST", "/api/embeddings", self._embeddings, OLLAMA,
                  "Ollama embeddings (older form)", in_schema=False),
        ]
        known = ", ".join(sorted(f"{r.method} {r.path}" for r in table))

        async def not_supported(call: Call):
            raise OpenAIError(f"{call.scope['method']} {call.scope['path']} is not supported; "
                              f"this server answers {known}", 404)

        return [*table, Route("*", "/api/", not_supported, OLLAMA, is_prefix=True,
                              in_schema=False)]

    @functools.cached_property
    def model(self) -> OllamaModelInfo:
        return read_model_info(self.ctx.model_path, self.ctx.model_name, self.ctx.max_model_len)

    async def running(self, call: Call):
        """``GET /`` for Ollama's clients and probes."""
        return PlainTextResponse("Ollama is running")

    # -- model routes ---------------------------------------------------------------------

    def _listed(self) -> dict:
        m = self.model
        return {"name": m.name, "model": m.name, "modified_at": m.modified_at, "size": m.size,
                "digest": m.digest, "details": m.details()}

    async def _version(self, call: Call):
        return _ENCODE({"version": OLLAMA_API_VERSION})

    async def _tags(self, call: Call):
        return _ENCODE({"models": [self._listed()]})

    async def _ps(self, call: Call):
        if self.ctx.engine.client.dead:
            return _ENCODE({"models": []})
        loaded = {**self._listed(), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0,
                  "context_length": self.ctx.max_model_len}
        return _ENCODE({"models": [loaded]})

    async def _show(self, call: Call):
        body = parse_body(OllamaShowRequest, call.body, _MISSING)
        name = body.model or body.name
        if not name:
            raise OpenAIError("model is required")
        check_model(self.model.names(), name)
        template = getattr(self.ctx.tokenizer, "chat_template", None) or ""
        return _ENCODE({"modelfile": f"FROM {self.model.name}\n", "parameters": "",
                        "template": template if isinstance(template, str) else "",
                        "details": self.model.details(), "model_info": self.model.info,
                        "capabilities": capabilities(self.ctx),
                        "modified_at": self.model.modified_at})

    # -- generation -----------------------------------------------------------------------

    async def _chat(self, call: Call):
        body = parse_body(OllamaChatRequest, call.body, _MISSING)
        check_model(self.model.names(), body.model)
        self._check_images(any(m.images for m in body.messages))
        shape = Shape(body.model, True, time.time())
        if not body.messages:
            return _ENCODE(shape.loaded())
        return await self._through(self.openai.chat_completion, call,
                                   _ENCODE(self._budgeted(body, body.to_openai())), shape,
                                   bool(body.stream))

    async def _generate(self, call: Call):
        body = parse_body(OllamaGenerateRequest, call.body, _MISSING)
        check_model(self.model.names(), body.model)
        self._check_images(bool(body.images))
        shape = Shape(body.model, False, time.time())
        if not body.prompt:
            return _ENCODE(shape.loaded())
        prompt_ids = (body.context or []) + self._prompt_ids(body)
        shape.context = Context(prompt_ids, self.ctx.tokenizer.encode)
        if body.context:  # the conversation so far, then the prompt: run as tokens
            if max(body.context) >= self.ctx.tokenizer.vocab_size:
                raise OpenAIError("context holds token ids out of the vocabulary",
                                  param="context")
            return await self._through(self.openai.completion, call,
                                       _ENCODE(body.to_openai_completion(prompt_ids)), shape,
                                       bool(body.stream))
        if body.raw or body.suffix is not None:
            return await self._through(self.openai.completion, call,
                                       _ENCODE(body.to_openai_completion()), shape,
                                       bool(body.stream))
        return await self._through(self.openai.chat_completion, call,
                                   _ENCODE(self._budgeted(body, body.to_openai_chat())), shape,
                                   bool(body.stream))

    def _check_images(self, has_images: bool) -> None:
        if has_images and self.ctx.images is None:
            raise OpenAIError(f"images are not supported: {TEXT_ONLY}")

    def _budgeted(self, body, chat: dict) -> dict:
        """``chat`` with ``think``'s level as a reasoning budget (`THINK_LEVEL_BUDGETS`) on a
        server with a tag-based reasoning parser; the level reaches the chat template either way."""
        if isinstance(body.think, str) and can_budget(self.ctx.reasoning_parser):
            chat["thinking_token_budget"] = THINK_LEVEL_BUDGETS[body.think]
        return chat

    def _prompt_ids(self, body: OllamaGenerateRequest) -> list[int]:
        """The prompt's tokens as the model reads them: as is (``raw``) or in the chat
        template, as the OpenAI handlers encode it."""
        tokenizer = self.ctx.tokenizer
        if body.suffix is not None:
            return fim_prompt(tokenizer, body.model, body.prompt, body.suffix)
        if body.raw:
            return tokenizer.encode(body.prompt)
        request = ChatCompletionRequest.model_validate(body.to_openai_chat())
        return tokenizer.encode_prompt(render_messages(self.ctx, request))

    async def _through(self, handler, call: Call, openai: bytes, shape: Shape, streamed: bool):
        """Run the OpenAI ``handler`` on the translated request ``openai`` (always streamed);
        its answer in Ollama's shape: NDJSON lines, or (``streamed`` false) one body."""
        try:
            answer = await handler(call.with_body(openai))
        except Exception as exc:  # noqa: BLE001 - re-raised naming the Ollama field
            raise _ollama_named(exc) from exc
        if type(answer) is bytes:
            return whole(shape, answer)
        lines = stream(shape, answer)
        return lines if streamed else await until_disconnect(call.receive, collect(lines))

    # -- embeddings -----------------------------------------------------------------------

    async def _embed_vectors(self, call: Call):
        body = parse_body(OllamaEmbedRequest, call.body, _MISSING)
        check_model(self.model.names(), body.model)
        arrival = time.time()
        server = self.openai.embeddings
        pooling = server.check_served()
        texts = body.texts()
        ids = await server.tokenize(texts, None, "input") if not body.truncate else \
            [one[:self.ctx.max_model_len]
             for one in await self.ctx.prep.encode_batch(texts)]
        if body.truncate:
            ids = await server.tokenize(None, ids, "input")  # the remaining checks
        self.ctx.check_alive()
        ticket = self.openai.admitter(call.admitted)(len(ids), sum(map(len, ids)), None)
        work = server.embed(ids, pooling, body.dimensions, 0, arrival, ticket)
        vectors = await until_disconnect(call.receive, work)
        return body, vectors, sum(map(len, ids)), arrival

    async def _embed(self, call: Call):
        body, vectors, num_tokens, arrival = await self._embed_vectors(call)
        return _ENCODE({"model": body.model, "embeddings": [v.tolist() for v in vectors],
                        "total_duration": int((time.time() - arrival) * 1e9),
                        "load_duration": 0, "prompt_eval_count": num_tokens})

    async def _embeddings(self, call: Call):
        body, vectors, _, _ = await self._embed_vectors(call)
        return _ENCODE({"embedding": vectors[0].tolist()})


# the OpenAI request fields an error may name -> the Ollama fields they came from
_OLLAMA_FIELD = {"response_format": "format", "max_tokens": "options.num_predict",
                 "repetition_penalty": "options.repeat_penalty", "stop": "options.stop",
                 "chat_template_kwargs": "think", "truncate_prompt_tokens": "truncate"}


def _ollama_named(exc: Exception) -> Exception:
    """An error from the OpenAI handler, its message prefixed with the Ollama field it is
    about (``format: ...``, ``options.temperature: ...``)."""
    status, body = error_response(exc)
    if body is None:
        return exc
    param = body["error"].get("param")
    if not param:
        return exc
    field = _OLLAMA_FIELD.get(param.split(".")[0])
    if field is None:
        head = param.split(".")[0]
        field = param if head in ("messages", "tools", "prompt") else f"options.{param}"
    return OpenAIError(f"{field}: {body['error']['message']}", status)
