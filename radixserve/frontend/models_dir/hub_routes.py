"""The hub's own routes: the folder's models and their states, loading and unloading them, and
the server-wide probes (health, version, load, metrics summed over the loaded models).

    GET /v1/models, /v1/models/{id}    every model, with ``status.value`` (Anthropic's cards
                                       when the request carries ``anthropic-version``)
    GET /api/tags, /api/ps             Ollama: every model; those loaded or loading
    POST /models/load, /models/unload  {"model": name} -> {"model", "state"}
"""

from __future__ import annotations

from urllib.parse import unquote

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel
from starlette.responses import Response

from radixserve import __version__
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.router import OPENAI, Call, Route
from radixserve.frontend.models_dir import listing
from radixserve.frontend.models_dir.hub import ModelHub, model_not_found
from radixserve.frontend.ollama.routes import OLLAMA

_ENCODE = msgspec.json.encode


class ModelRequest(BaseModel):
    model: str


def hub_routes(hub: ModelHub) -> list[Route]:
    registry = CollectorRegistry()
    registry.register(_MergedMetrics(hub))

    async def health(call: Call):
        """200 while the server runs; per model its state, "unavailable" for a loaded one
        whose engine is down (being restarted)."""
        states = {e.name: "unavailable" if s is not None and s.served is not None
                  and s.served.ctx.engine.client.dead else listing.state_of(s)
                  for e, s in hub.listing()}
        return _ENCODE({"status": "ok", "models": states})

    async def version(call: Call):
        return _ENCODE({"version": __version__})

    async def load(call: Call):
        return _ENCODE({s.entry.name: s.served.ctx.engine.client.load() for s in hub.loaded()})

    async def metrics(call: Call):
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def models(call: Call):
        rows = hub.listing()
        if _anthropic(call):
            cards = [listing.anthropic_card(e, s) for e, s in rows]
            return _ENCODE({"data": cards, "has_more": False,
                            "first_id": cards[0]["id"] if cards else None,
                            "last_id": cards[-1]["id"] if cards else None})
        return _ENCODE({"object": "list", "data": [listing.openai_card(e, s) for e, s in rows]})

    async def model(call: Call):
        name = unquote(call.scope["path"][len("/v1/models/"):])
        entry = hub.catalog.find(name)
        if entry is None:
            raise model_not_found(name, list(hub.catalog.entries()))
        slot = hub.slots.get(entry.name)
        card = listing.anthropic_card if _anthropic(call) else listing.openai_card
        return _ENCODE(card(entry, slot))

    async def tags(call: Call):
        rows = hub.listing()
        infos = await listing.read_infos([e for e, _ in rows])
        return _ENCODE({"models": [listing.ollama_tag(e, s, info)
                                   for (e, s), info in zip(rows, infos)]})

    async def ps(call: Call):
        rows = [(e, s) for e, s in hub.listing() if s is not None and s.state != "unloaded"]
        infos = await listing.read_infos([e for e, _ in rows])
        return _ENCODE({"models": [listing.ollama_ps(e, s, info)
                                   for (e, s), info in zip(rows, infos)]})

    async def load_model(call: Call):
        name = parse_body(ModelRequest, call.body).model
        slot = await hub.load(name)
        return _ENCODE({"model": slot.entry.name, "state": slot.state})

    async def unload_model(call: Call):
        name = parse_body(ModelRequest, call.body).model
        slot = hub.slot(name)
        was_loaded = await hub.unload(slot.entry.name)
        return _ENCODE({"model": slot.entry.name, "state": slot.state,
                        "was_loaded": was_loaded})

    return [
        Route("GET", "/health", health, OPENAI, '200 {"status": "ok", "models": {name: '
              'state}} while the server runs', is_open=True),
        Route("GET", "/version", version, OPENAI, "The server's version", is_open=True),
        Route("GET", "/load", load, OPENAI, "Requests and KV use of each loaded model"),
        Route("GET", "/metrics", metrics, OPENAI, "Prometheus metrics of the loaded models",
              media="text/plain", is_open=True),
        Route("GET", "/v1/models", models, OPENAI, "Every model of --models-dir, with its "
              "state (status.value: loaded, loading, unloading, unloaded)"),
        Route("GET", "/v1/models/{model}", model, OPENAI, "One model by id (404 naming the "
              "available ones)"),
        Route("GET", "/v1/models/", model, OPENAI, is_prefix=True, in_schema=False),
        Route("GET", "/api/tags", tags, OLLAMA, "Ollama: every model, with its state"),
        Route("GET", "/api/ps", ps, OLLAMA, "Ollama: the models loaded or loading"),
        Route("POST", "/models/load", load_model, OPENAI, 'Load {"model": name} now (waits '
              "for the load; evicts as a request would)", ModelRequest),
        Route("POST", "/models/unload", unload_model, OPENAI, 'Unload {"model": name} (waits '
              "for its requests in flight, up to --drain-timeout)", ModelRequest),
    ]


def _anthropic(call: Call) -> bool:
    return any(k == b"anthropic-version" for k, _ in call.scope.get("headers", ()))


class _MergedMetrics:
    """Every loaded model's metric families, their samples (labelled by model_name) merged
    into one family per name (Prometheus reads a name's HELP and TYPE once)."""

    def __init__(self, hub: ModelHub) -> None:
        self.hub = hub

    def collect(self):
        families: dict[str, object] = {}
        for slot in self.hub.loaded():
            for family in slot.served.metrics.registry.collect():
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()
