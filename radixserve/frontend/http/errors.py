"""How an exception becomes an HTTP error answer in OpenAI's shape: one mapping for every route
(the Anthropic and Ollama routes restate its status and message in their own shapes)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from radixserve.frontend.async_llm import EngineRequestError, EngineStepError
from radixserve.frontend.core_client import EngineDeadError
from radixserve.frontend.http.protocol_base import (ClientDisconnected, OpenAIError, error_body,
                                                    validation_error_body, value_error_body)


def error_response(exc: Exception) -> tuple[int, dict | None]:
    """(HTTP status, OpenAI error body) for an exception raised while serving a request;
    a client that left gets 499 and no body (nobody reads it)."""
    if isinstance(exc, ValidationError):
        return 400, validation_error_body(exc)
    if isinstance(exc, OpenAIError):
        return exc.status, error_body(exc.message, exc.type, exc.param, exc.code)
    if isinstance(exc, EngineDeadError):
        return 503, error_body(f"engine unavailable: {exc}", "service_unavailable")
    if isinstance(exc, EngineStepError):
        return 500, error_body(str(exc), "internal_error")
    if isinstance(exc, ClientDisconnected):
        return 499, None
    if isinstance(exc, ValueError):  # SamplingParams checks, grammar errors, engine refusals
        return 400, value_error_body(exc)
    return 500, error_body(f"internal error: {type(exc).__name__}: {exc}", "internal_error")


async def send_json(send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A whole JSON response through an ASGI ``send``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


def error_headers(exc: Exception) -> list[tuple[bytes, bytes]]:
    """``Retry-After`` for an error that says when to retry (429, queue timeouts);
    ``Connection: close`` for one answered before its body was read (413, 408, 401); ``Allow``
    for a 405 (the path's methods)."""
    headers = []
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    allow = getattr(exc, "allow", None)
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    if getattr(exc, "close_connection", False):
        headers.append((b"connection", b"close"))
    return headers


async def send_error(send, exc: Exception) -> None:
    status, body = error_response(exc)
    await send_json(send, status, json.dumps(body, separators=(",", ":")).encode()
                    if body is not None else b"", error_headers(exc))


def sse_error_chunk(exc: Exception) -> bytes | None:
    """An error after an OpenAI stream started, as a last ``data:`` event carrying an error
    body (an engine's error with its status as ``code``; others as `error_response` has it)."""
    if isinstance(exc, EngineDeadError):
        body = error_body(f"engine unavailable: {exc}", "service_unavailable", code=503)
    elif isinstance(exc, EngineStepError):
        body = error_body(str(exc), "internal_error", code=500)
    elif isinstance(exc, EngineRequestError):
        body = error_body(str(exc))
    else:  # an OpenAIError (e.g. a queue timeout before the first token), or a bug
        body = error_response(exc)[1]
    return None if body is None else f"data: {json.dumps(body)}\n\n".encode()
