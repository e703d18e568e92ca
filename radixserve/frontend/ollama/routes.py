"""Ollama's API as plain ASGI, in front of the OpenAI routes (`GenerationRoutes`, whose
handlers /api/chat and /api/generate reuse; see `serving_ollama`):

    GET  /                 "Ollama is running"       POST /api/chat      chat, NDJSON stream
    GET  /api/version      the server's version      POST /api/generate  prompt, NDJSON stream
    GET  /api/tags         the served model          POST /api/embed     embeddings
    GET  /api/ps           the model, while loaded   POST /api/embeddings (older form)
    POST /api/show         the model's details

Errors on these paths are Ollama's ``{"error": "message"}`` with the same status the OpenAI
routes would give. Every other path goes to the app behind.
"""

from __future__ import annotations

import functools
import time

import msgspec
from pydantic import BaseModel

from radixserve import __version__
from radixserve.frontend.http.errors import error_response, send_json
from radixserve.frontend.http.asgi_io import read_body, send_stream, until_disconnect
from radixserve.frontend.openai.routes import GenerationRoutes
from radixserve.frontend.ollama.models import OllamaModelInfo, read_model_info
from radixserve.frontend.ollama.protocol import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from radixserve.frontend.http.protocol_base import ClientDisconnected, OpenAIError
from radixserve.frontend.ollama.serving import (
    OllamaStreamError,
    Shape,
    check_model,
    stream,
    whole,
)

_NDJSON = [(b"content-type", b"application/x-ndjson")]
_ENCODE = msgspec.json.encode


class OllamaRoutes:
    """ASGI app: Ollama's paths; anything else goes to ``inner``."""

    def __init__(self, inner: GenerationRoutes) -> None:
        self.inner = inner
        self.ctx = inner.ctx
        self.routes = {
            ("GET", "/api/version"): self._version, ("GET", "/api/tags"): self._tags,
            ("GET", "/api/ps"): self._ps, ("POST", "/api/show"): self._show,
            ("POST", "/api/chat"): self._chat, ("POST", "/api/generate"): self._generate,
            ("POST", "/api/embed"): self._embed, ("POST", "/api/embeddings"): self._embeddings,
        }

    @functools.cached_property
    def model(self) -> OllamaModelInfo:
        return read_model_info(self.ctx.model_path, self.ctx.model_name, self.ctx.max_model_len)

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/" or path.startswith("/api/")):
            return await self.inner(scope, receive, send)
        method = scope["method"]
        if path == "/":
            # a browser (Accept: text/html) gets the playground (ui_routes); Ollama's clients
            # and probes get its liveness answer
            accept = dict(scope.get("headers") or ()).get(b"accept", b"")
            if method not in ("GET", "HEAD") or b"text/html" in accept:
                return await self.inner(scope, receive, send)
            return await _send_text(send, b"Ollama is running")
        handler = self.routes.get((method, path))
        try:
            if handler is None:
                known = sorted(f"{m} {p}" for m, p in self.routes)
                raise OpenAIError(f"{method} {path} is not supported; this server answers "
                                  f"{', '.join(known)}", 404)
            raw = await read_body(receive) if method == "POST" else b""
            admitted: list = []
            try:
                whole_body, lines = await handler(raw, receive, admitted)
                if lines is None:
                    return await send_json(send, 200, whole_body)
                return await send_stream(lines, receive, send, _NDJSON, _error_line)
            finally:
                for ticket in admitted:
                    ticket.release()
        except ClientDisconnected:
            return None
        except Exception as exc:  # noqa: BLE001 - every error is answered with a body
            return await send_ollama_error(send, exc)

    # -- model routes ---------------------------------------------------------------------

    def _listed(self) -> dict:
        m = self.model
        return {"name": m.name, "model": m.name, "modified_at": m.modified_at, "size": m.size,
                "digest": m.digest, "details": m.details()}

    async def _version(self, raw, receive, admitted):
        return _ENCODE({"version": __version__}), None

    async def _tags(self, raw, receive, admitted):
        return _ENCODE({"models": [self._listed()]}), None

    async def _ps(self, raw, receive, admitted):
        if self.ctx.engine.client.dead:
            return _ENCODE({"models": []}), None
        loaded = {**self._listed(), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0,
                  "context_length": self.ctx.max_model_len}
        return _ENCODE({"models": [loaded]}), None

    async def _show(self, raw, receive, admitted):
        body = _parse(OllamaShowRequest, raw)
        name = body.model or body.name
        if not name:
            raise OpenAIError("model is required")
        check_model(self.model.names(), name)
        capabilities = ["completion"]
        if self.ctx.tool_parser is not None:
            capabilities.append("tools")
        if self.ctx.reasoning_parser is not None:
            capabilities.append("thinking")
        if self.ctx.embedding.pooling is not None:
            capabilities.append("embedding")
        template = getattr(self.ctx.tokenizer, "chat_template", None) or ""
        return _ENCODE({"modelfile": f"FROM {self.model.name}\n", "parameters": "",
                        "template": template if isinstance(template, str) else "",
                        "details": self.model.details(), "model_info": self.model.info,
                        "capabilities": capabilities,
                        "modified_at": self.model.modified_at}), None

    # -- generation -----------------------------------------------------------------------

    async def _chat(self, raw, receive, admitted):
        body = _parse(OllamaChatRequest, raw)
        check_model(self.model.names(), body.model)
        shape = Shape(body.model, True, time.time())
        if not body.messages:
            return _ENCODE(shape.loaded()), None
        openai = _ENCODE(body.to_openai())
        return await self._through(self.inner._chat_completion, openai, shape, receive,
                                   admitted)

    async def _generate(self, raw, receive, admitted):
        body = _parse(OllamaGenerateRequest, raw)
        check_model(self.model.names(), body.model)
        shape = Shape(body.model, False, time.time())
        if not body.prompt:
            return _ENCODE(shape.loaded()), None
        if body.raw:
            return await self._through(self.inner._completion,
                                       _ENCODE(body.to_openai_completion()), shape, receive,
                                       admitted)
        return await self._through(self.inner._chat_completion, _ENCODE(body.to_openai_chat()),
                                   shape, receive, admitted)

    async def _through(self, handler, openai: bytes, shape: Shape, receive, admitted):
        """Run the OpenAI ``handler`` on the translated request; its answer in Ollama's
        shape."""
        try:
            answer, chunks = await handler(openai, receive, admitted)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the Ollama field
            raise _ollama_named(exc) from exc
        if chunks is None:
            return whole(shape, answer), None
        return None, stream(shape, chunks)

    # -- embeddings -----------------------------------------------------------------------

    async def _embed_vectors(self, raw, receive, admitted):
        body = _parse(OllamaEmbedRequest, raw)
        check_model(self.model.names(), body.model)
        arrival = time.time()
        server = self.inner.embeddings
        pooling = server.check_served()
        texts = body.texts()
        ids = await server.tokenize(texts, None, "input") if not body.truncate else \
            [one[:self.ctx.max_model_len]
             for one in await self.ctx.prep.encode_batch(texts)]
        if body.truncate:
            ids = await server.tokenize(None, ids, "input")  # the remaining checks
        self.ctx.check_alive()
        ticket = self.inner.admitter(admitted)(len(ids), sum(map(len, ids)), None)
        work = server.embed(ids, pooling, body.dimensions, 0, arrival, ticket)
        vectors = await until_disconnect(receive, work)
        return body, vectors, sum(map(len, ids)), arrival

    async def _embed(self, raw, receive, admitted):
        body, vectors, num_tokens, arrival = await self._embed_vectors(raw, receive, admitted)
        return _ENCODE({"model": body.model, "embeddings": [v.tolist() for v in vectors],
                        "total_duration": int((time.time() - arrival) * 1e9),
                        "load_duration": 0, "prompt_eval_count": num_tokens}), None

    async def _embeddings(self, raw, receive, admitted):
        body, vectors, _, _ = await self._embed_vectors(raw, receive, admitted)
        return _ENCODE({"embedding": vectors[0].tolist()}), None


# the OpenAI request fields an error may name -> the Ollama fields they came from
_OLLAMA_FIELD = {"response_format": "format", "max_tokens": "options.num_predict",
                 "repetition_penalty": "options.repeat_penalty", "stop": "options.stop",
                 "chat_template_kwargs": "think"}


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


def _parse(model: type[BaseModel], raw: bytes):
    if not raw.strip():
        raise OpenAIError("missing request body")
    return model.model_validate_json(raw)


async def send_ollama_error(send, exc: Exception) -> None:
    """Ollama's error body, ``{"error": "message"}``, with the OpenAI routes' status."""
    status, body = error_response(exc)
    if body is None:
        return
    await send_json(send, status, _ENCODE({"error": body["error"]["message"]}))


async def _send_text(send, text: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})


def _error_line(exc: Exception) -> bytes:
    """An error after the stream started, as a last ``{"error": ...}`` line."""
    if isinstance(exc, OllamaStreamError):
        return _error_bytes(str(exc))
    status, body = error_response(exc)
    return _error_bytes(body["error"]["message"] if body else str(exc))


def _error_bytes(message: str) -> bytes:
    return _ENCODE({"error": message}) + b"\n"
