"""``/openapi.json`` for every route: FastAPI describes the routes it serves; the generation and
render endpoints are plain ASGI in front of it (`generation_routes`), so their paths are added
here from the same pydantic request and response models they parse and answer with.

Errors are described as they are answered: an OpenAI error body (`ErrorResponse`) with 400
for a request that fails validation (FastAPI's default schema says 422, which this server
never sends), 401 / 404 / 413 / 415 / 503 where they apply.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest, ChatCompletionResponse
from radixserve.frontend.openai.protocol import CompletionRequest, CompletionResponse
from radixserve.frontend.http.protocol_base import ErrorResponse
from radixserve.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from radixserve.frontend.openai.protocol_chat import RenderResponse
from radixserve.frontend.openai.protocol_embedding import EmbeddingRequest, EmbeddingResponse
from radixserve.frontend.ollama.protocol import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from radixserve.frontend.responses.protocol import ResponsesRequest

_REF = "#/components/schemas/{model}"
_ERRORS = {"400": "invalid request (an OpenAI error body names the parameter)",
           "401": "missing or wrong API key (with --api-key)",
           "404": "unknown model",
           "413": "request body too large",
           "415": "the body is not declared as application/json",
           "503": "the engine is unavailable"}

# path -> (summary, request model, response model (None: a JSON object described in the
# route's own docs), whether it can stream)
_GENERATION: dict[str, tuple[str, type[BaseModel], type[BaseModel] | None, bool]] = {
    "/v1/completions": ("Completions", CompletionRequest, CompletionResponse, True),
    "/v1/chat/completions": ("Chat completions", ChatCompletionRequest, ChatCompletionResponse,
                             True),
    "/v1/chat/completions/render": ("The chat template and tokenization alone",
                                    ChatCompletionRequest, RenderResponse, False),
    "/v1/completions/render": ("The completion's prompts tokenized alone (a list of render "
                               "answers, one per prompt)", CompletionRequest, None, False),
    "/v1/embeddings": ("Embeddings", EmbeddingRequest, EmbeddingResponse, False),
    "/v1/responses": ("OpenAI Responses (typed server-sent events when streamed)",
                      ResponsesRequest, None, True),
    "/v1/messages": ("Anthropic Messages (its error shape on this route)", MessagesRequest,
                     None, True),
    "/v1/messages/count_tokens": ("Anthropic token count", CountTokensRequest, None, False),
    "/api/chat": ("Ollama chat (NDJSON lines when streamed)", OllamaChatRequest, None, False),
    "/api/generate": ("Ollama generate (NDJSON lines when streamed)", OllamaGenerateRequest,
                      None, False),
    "/api/embed": ("Ollama embeddings", OllamaEmbedRequest, None, False),
    "/api/show": ("Ollama model details", OllamaShowRequest, None, False),
}
# Ollama's GET routes (plain ASGI too): path -> summary
_GETS = {"/api/tags": "Ollama: the models served", "/api/ps": "Ollama: the models loaded",
         "/api/version": "Ollama: the version"}


def describe_generation_routes(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and so ``/openapi.json``) include the plain-ASGI routes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # FastAPI caches it in app.openapi_schema; completed in place
        _add_generation_paths(schema)
        _answer_validation_errors_as_400(schema)
        return schema

    app.openapi = openapi


def _add_generation_paths(schema: dict[str, Any]) -> None:
    models = [(m, "validation") for _, m, _, _ in _GENERATION.values()]
    models += [(m, "serialization") for _, _, m, _ in _GENERATION.values() if m is not None]
    models.append((ErrorResponse, "serialization"))
    refs, defs = models_json_schema(models, ref_template=_REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in defs.get("$defs", {}).items():
        # the same model FastAPI described already (FastAPI leaves out null defaults)
        known = components.setdefault(name, definition)
        assert known.get("properties", {}).keys() == definition.get("properties", {}).keys(), (
            f"two different models named {name}")
    for path, (summary, request, response, can_stream) in _GENERATION.items():
        ok = {"application/json": {"schema": {"type": "object"} if response is None
                                   else refs[(response, "serialization")]}}
        if can_stream:
            ok["text/event-stream"] = {"schema": {"type": "string", "description": (
                "with stream: true, server-sent events: one JSON chunk per data: line, then "
                "data: [DONE]")}}
        responses = {"200": {"description": "the response", "content": ok}}
        responses.update(_error_responses())
        schema["paths"][path] = {"post": {
            "summary": summary, "operationId": path.strip("/").replace("/", "_"),
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": refs[(request, "validation")]}}},
            "responses": responses}}
    for path, summary in _GETS.items():
        schema["paths"][path] = {"get": {
            "summary": summary, "operationId": path.strip("/").replace("/", "_"),
            "responses": {"200": {"description": "a JSON object", "content": {
                "application/json": {"schema": {"type": "object"}}}}}}}


def _error_responses() -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}
    return {status: {"description": text, "content": body} for status, text in _ERRORS.items()}


def _answer_validation_errors_as_400(schema: dict[str, Any]) -> None:
    """FastAPI's routes: their 422 (HTTPValidationError) is answered as a 400 error body."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.update(_error_responses())
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
