"""Resetting the prefix cache, as routers and operators ask a worker to.

    POST /reset_prefix_cache[?reset_running_requests=false&reset_external=false]   (vLLM's)
         200, empty body     every live replica dropped its cached pages; with KV events on,
                             each published ``AllBlocksCleared``
         409                 a replica refused: running requests lock cached pages (with
                             ``reset_running_requests=true`` they are preempted first and
                             resume by recomputing)
         400                 a query value that is not a boolean
    POST|GET /flush_cache    (SGLang's, which sglang-router fans out): the same reset without
                             preempting; 400 when refused, as SGLang answers; 403
                             ``cross_site_request`` when a page on another site asked

vLLM mounts its route only with ``VLLM_SERVER_DEV_MODE=1`` and answers 409 on a refusal since
late 2025 (200 whatever happened before); here it is always mounted and, like every route
that is not a probe, needs the API key when the server has one. ``reset_external`` (a KV
connector's cache) is accepted and has nothing to reset: radixserve has no connector.

SGLang answers GET too (``curl URL/flush_cache``, older scripts), so it stays, but a GET is
what any web page can send without asking (``<img src=".../flush_cache">``), and on a
server without a key it would flush the cache on every visit. A browser says where a
request comes from (``Sec-Fetch-Site``, ``Origin``, ``Referer``); routers and curl send none
of them, so one that names another site is refused (`cross_site`). The POSTs need no such
check: a browser's cross-site POST carries ``Origin`` and is refused (415) by the guard.
"""

from __future__ import annotations

import dataclasses
import logging
from urllib.parse import urlsplit

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


def cross_site(call: Call) -> str | None:
    """The header showing ``call`` came from a web page on another origin than this server's
    (``Sec-Fetch-Site`` other than same-origin or none, or an ``Origin`` or ``Referer`` whose
    host is not the request's ``Host``); None when none does (curl, routers, our pages)."""
    headers = dict(call.scope["headers"])
    site = headers.get(b"sec-fetch-site")
    if site is not None and site not in (b"same-origin", b"none"):
        return f"Sec-Fetch-Site: {site.decode('latin-1')}"
    host = headers.get(b"host", b"").decode("latin-1").lower()
    for name in (b"origin", b"referer"):
        value = headers.get(name)
        if value is not None and urlsplit(value.decode("latin-1")).netloc.lower() != host:
            return f"{name.decode().title()}: {value.decode('latin-1')[:200]}"
    return None


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
        if (source := cross_site(call)) is not None:
            raise OpenAIError(f"/flush_cache refused: a page on another site asked ({source})",
                              403, "permission_error", code="cross_site_request")
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
