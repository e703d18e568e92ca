"""The hub's ASGI front: one `Guard` (API key, body size, content type: checked once, here)
over one `Router` whose table is the single-model table with

- the hub's own routes in place of the model ones: /health, /version, /metrics, /load,
  /v1/models (+ /{id}), /api/tags, /api/ps, and POST /models/load, /models/unload;
- the pages and Ollama's /api/version as they are (they need no model);
- every other route forwarding: its body's ``model`` (Ollama: or ``name``; a GET: the ``model``
  query parameter) picks the model, `ModelHub.acquire` loads it if needed, and the request is
  handed to that model's own `Router` in-process, the body replayed. Errors before the hand-off
  (404 unknown model, 400 not a model, 503/507 no room) take the route's own shape (OpenAI,
  Anthropic, Ollama) through its `Wire`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from types import SimpleNamespace

import msgspec

from radixserve.frontend.app import Guard, build_app, description_routes
from radixserve.frontend.http.body_reader import replay
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import Call, Route, Router
from radixserve.frontend.models_dir import listing
from radixserve.frontend.models_dir.args import parse_keep_alive
from radixserve.frontend.models_dir.hub import ModelHub
from radixserve.frontend.models_dir.hub_routes import hub_routes
from radixserve.frontend.ollama.routes import OLLAMA

_ENCODE = msgspec.json.encode
_AS_IS = ("/", "/ui/engine", "/ui/static/", "/api/version", "/api/")  # no model needed
_DESCRIPTION = ("/openapi.json", "/docs", "/redoc")


def build_hub_app(hub: ModelHub, api_key: str | None, limits, hosts=None) -> Guard:
    """The server's app; sets ``hub.drain`` (one drain for every model's router). ``hosts``:
    the Host rule (a `host_check.HostPolicy`; None: any Host)."""
    own = hub_routes(hub)
    taken = {(r.method, r.path) for r in own}
    routes = list(own)
    for route in shape_routes(limits):
        if (route.method, route.path) in taken or route.path in _DESCRIPTION:
            continue
        routes.append(route if route.path in _AS_IS else
                      dataclasses.replace(route, handler=forwarder(hub, route)))
    routes += description_routes(routes)
    router = Router(routes)
    hub.drain = router.drain
    return Guard(router, api_key, limits.max_request_bytes, limits.body_read_timeout,
                 hosts=hosts)


def shape_routes(limits) -> list[Route]:
    """The single-model route table (paths, methods, wires), built over a placeholder context
    whose handlers are never called: the hub serves each path in its shape."""
    from radixserve.frontend.http.metrics import ServerMetrics
    from radixserve.frontend.openai.serving import ServingContext

    client = SimpleNamespace(dead=None, stats=None, replicas=[])
    engine = SimpleNamespace(client=client, tokenizer=None, max_model_len=0)
    app = build_app(ServingContext(engine, ""), ServerMetrics(client, "", 1), None, limits)
    return app.router.routes


def forwarder(hub: ModelHub, route: Route):
    """The handler of ``route`` in the hub: pick the model, load it, hand the request on."""
    is_ollama = route.wire is OLLAMA
    may_load = route.method != "GET"  # a GET (engine view, stored response) loads nothing

    async def forward(call: Call):
        fields = _json_object(call.body)
        name = _model_name(hub, call, fields, is_ollama)
        keep_alive = _keep_alive(fields) if is_ollama else None
        if keep_alive == 0 and _is_empty_ollama(route.path, fields):
            return await _ollama_unload(hub, name, route.path)
        if route.path == "/api/show" and (slot := hub.slot(name)).state != "loaded":
            # no load to describe a model; its files parsed off the event loop
            return _ENCODE(await asyncio.to_thread(listing.ollama_show, slot.entry))
        served = await hub.acquire(name, load=may_load)

        async def app(scope, receive, send):
            try:
                await served.router(scope, replay(call.body, receive), send)
            finally:
                hub.release(served, keep_alive)

        return app

    return forward


def _json_object(body: bytes) -> dict:
    if not body:
        return {}
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}  # the model's own route answers the 400
    return fields if isinstance(fields, dict) else {}


def _model_name(hub: ModelHub, call: Call, fields: dict, is_ollama: bool) -> str:
    """The model the request names; without one, the folder's only model or the model used
    last; 400 listing the models otherwise."""
    name = fields.get("model") or (fields.get("name") if is_ollama else None) \
        or call.query.get("model")
    if isinstance(name, str) and name:
        return name
    if name is not None and not isinstance(name, str):
        raise OpenAIError("model must be a string", param="model")
    names = list(hub.catalog.entries())
    if len(names) == 1:
        return names[0]
    recent = hub.most_recent()
    if recent is not None:
        return recent.entry.name
    raise OpenAIError(f"model is required: one of {', '.join(names) or '(none)'}",
                      param="model")


def _keep_alive(fields: dict) -> float | None:
    try:
        return parse_keep_alive(fields.get("keep_alive"))
    except ValueError as exc:
        raise OpenAIError(str(exc), param="keep_alive") from None


def _is_empty_ollama(path: str, fields: dict) -> bool:
    """Ollama's load/unload call: /api/generate without a prompt, /api/chat without
    messages."""
    return (path == "/api/generate" and not fields.get("prompt")) or \
        (path == "/api/chat" and not fields.get("messages"))


async def _ollama_unload(hub: ModelHub, name: str, path: str) -> bytes:
    """keep_alive 0 with an empty prompt: unload now (if loaded), as Ollama answers it."""
    slot = hub.slot(name)
    await hub.unload(slot.entry.name, "keep_alive 0")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    answer = {"model": name, "created_at": now, "done": True, "done_reason": "unload"}
    if path == "/api/chat":
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    return _ENCODE(answer)

