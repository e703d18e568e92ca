"""Resetting the prefix cache, as routers and operators ask a worker to.

    POST /reset_prefix_cache[?reset_running_requests=false&reset_external=false]   (vLLM's)
         200, empty body     every live replica dropped its cached pages; with KV events on,
                             each published ``AllBlocksCleared``
         409                 a replica refused: running requests lock cached pages (with
                             ``reset_running_requests=true`` they are preempted first and
                             resume by recomputing)
         400                 a query value that is not a boolean
    POST|GET /flush_cache    (SGLang's, which sglang-router fans out): the same reset without
                             preempting; 400 when refused, as SGLang answers

vLLM mounts its route only with ``VLLM_SERVER_DEV_MODE=1`` and answers 409 on a refusal since
late 2025 (200 whatever happened before); here it is always mounted and, like every route
that is not a probe, needs the API key when the server has one. ``reset_external`` (a KV
connector's cache) is accepted and has nothing to reset: radixserve has no connector.
"""

from __future__ import annotations

import dataclasses
import logging

from starlette.responses import JSONResponse, PlainTextResponse, Response

from radixserve.frontend.http.protocol_base import OpenAIError, error_body
from radixserve.frontend.http.router import OPENAI, Call, Route

logger = logging.getLogger(__name__)

_TRUE = {"1", "true", "t", "yes", "y", "on"}  # the spellings FastAPI's bool query accepts
_FALSE = {"0", "false", "f", "no", "n", "off"}
# routers and curl POST these with no body and no Content-Type: read whatever the type, but
# still refused (415) to a browser (its Origin header), as Ollama's routes are (content_type.py)
ANY_BODY = dataclasses.replace(OPENAI, json_only=False)


def query_bool(call: Call, name: str) -> bool:
    """The boolean query parameter ``name`` (absent: False); 400 for any other spelling."""
    value = call.query.get(name)
    if value is None or value.lower() in _FALSE:
        return False
    if value.lower() in _TRUE:
        return True
    raise OpenAIError(f"query parameter {name} must be a boolean, got {value!r}", 400,
                      param=name)


def cache_routes(ctx) -> list[Route]:
    client = ctx.engine.client

    async def reset_prefix_cache(call: Call):
        preempt = query_bool(call, "reset_running_requests")
        query_bool(call, "reset_external")  # validated; nothing external to reset
        logger.info("Resetting prefix cache (reset_running_requests=%s)", preempt)
        if await client.reset_prefix_cache(preempt):
            return Response(status_code=200)
        return _refused(409, "prefix cache reset failed: running requests hold cached "
                        "blocks (retry, or pass reset_running_requests=true)")

    async def flush_cache(call: Call):
        if await client.reset_prefix_cache(False):
            return PlainTextResponse("Cache flushed.\n")
        return _refused(400, "cache not flushed: running requests hold cached blocks")

    summary = ("Drop every cached KV page (vLLM's): 200, or 409 while running requests hold "
               "some; ?reset_running_requests=true preempts them first")
    return [Route("POST", "/reset_prefix_cache", reset_prefix_cache, ANY_BODY, summary,
                  media=None),
            Route("POST", "/flush_cache", flush_cache, ANY_BODY,
                  "SGLang's cache flush: the same reset, never preempting (400 if refused)",
                  media="text/plain"),
            Route("GET", "/flush_cache", flush_cache, ANY_BODY, in_schema=False,
                  media="text/plain")]


def _refused(status: int, message: str) -> JSONResponse:
    kind = "conflict" if status == 409 else "invalid_request_error"
    return JSONResponse(error_body(message, kind, None, status), status_code=status)
