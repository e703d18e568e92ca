"""``/openapi.json`` generated from the route table (`router.Route`): each route's request,
query and response models, the media types it answers with (a stream's from its `Wire`).

Errors are described as they are answered: the route's API's error body (`Wire.error_model`)
with 400 for a request that fails validation, 401 / 404 / 413 / 415 / 503 where they apply.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.json_schema import models_json_schema

from radixserve.frontend.http.router import Route

_REF = "#/components/schemas/{model}"
_ERRORS = {"400": "invalid request (an OpenAI error body names the parameter)",
           "401": "missing or wrong API key (with --api-key)",
           "404": "unknown model",
           "413": "request body too large",
           "415": "the body is not declared as application/json",
           "503": "the engine is unavailable"}


def openapi_schema(routes: list[Route], title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the routes with ``in_schema``."""
    routes = [r for r in routes if r.in_schema]
    models = {(r.request, "validation") for r in routes if r.request is not None}
    models |= {(r.response, "serialization") for r in routes if r.response is not None}
    models |= {(r.wire.error_model, "serialization") for r in routes}
    refs, defs = models_json_schema(sorted(models, key=lambda m: (m[0].__name__, m[1])),
                                    ref_template=_REF)
    paths: dict[str, dict] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, refs)
    return {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
            "components": {"schemas": defs.get("$defs", {})}}


def _operation(route: Route, refs: dict) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "the response"}
    if route.media is not None:
        schema = ({"type": "object" if route.media == "application/json" else "string"}
                  if route.response is None else refs[(route.response, "serialization")])
        ok["content"] = {route.media: {"schema": schema}}
    if route.can_stream:
        ok["content"][route.wire.stream_media] = {"schema": {
            "type": "string", "description": route.wire.stream_doc}}
    name = re.sub(r"[^a-z0-9]+", "_", f"{route.method} {route.path}".lower()).strip("_")
    operation: dict[str, Any] = {"summary": route.summary, "operationId": name,
                                 "responses": {"200": ok}}
    parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"\{(\w+)\}", route.path)]
    if route.query is not None:
        properties = route.query.model_json_schema()["properties"]
        parameters += [{"name": name, "in": "query", "required": field.is_required(),
                        "schema": properties[name]}
                       for name, field in route.query.model_fields.items()]
    if parameters:
        operation["parameters"] = parameters
    if route.request is not None:
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": refs[(route.request, "validation")]}}}
    if route.request is not None or parameters:
        body = {"application/json": {"schema": refs[(route.wire.error_model,
                                                      "serialization")]}}
        operation["responses"].update({status: {"description": text, "content": body}
                                       for status, text in _ERRORS.items()})
    return operation
