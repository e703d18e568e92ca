"""The one route table and the plain-ASGI router that serves it.

Each API's ``routes.py`` lists its `Route`s (method, path -> handler, and the models that
describe it); `Router` dispatches them and `openapi.openapi_schema` describes them. A request
costs a dict lookup, one `Call` and the handler (through FastAPI a request crossed about ten
layers and each stream chunk five ``send`` wrappers: a third of the API process, measured).

A handler answers with ``bytes`` (a whole 200 JSON body), an async iterator of chunks (a 200
stream in its route's `Wire` format; the client leaving closes it, which aborts the engine
requests behind it), or any ASGI app (a starlette ``Response``: other statuses, media types,
files). An exception is answered in the route's error shape (`Wire.send_error`). Admission
tickets a handler puts in ``call.admitted`` are released when the response ends, however.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from pydantic import BaseModel

from radixserve.frontend.http.asgi_io import SSE_DONE, SSE_HEADERS, read_body, send_stream
from radixserve.frontend.http.drain import Drain, ServerDraining
from radixserve.frontend.http.errors import send_error, send_json, sse_error_chunk
from radixserve.frontend.http.protocol_base import ErrorResponse, OpenAIError

Answer = bytes | AsyncIterator | Callable  # a JSON body, a stream, or an ASGI app
_NO_PARAMS: dict[str, str] = {}
_AS_GET = {"HEAD": "GET"}  # a GET route answers HEAD too


@dataclass(slots=True)
class Call:
    """One request as a handler sees it: the ASGI ``scope`` and ``receive``, the whole body
    (POST; empty otherwise), the path's ``{name}`` parameters, ``admitted``, where the
    handler puts the admission tickets to release when the response ends, and ``headers``,
    those it adds to its 200 answer (a body or a stream)."""

    scope: dict
    receive: Callable
    body: bytes
    admitted: list
    path_params: dict[str, str]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def with_body(self, body: bytes) -> Call:
        """The same request carrying ``body`` (a route that translates into another API's)."""
        return Call(self.scope, self.receive, body, self.admitted, self.path_params,
                    self.headers)

    @property
    def query(self) -> dict[str, str]:
        """The query string's parameters (the last of a repeated one)."""
        return dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))


@dataclass(frozen=True, slots=True)
class Wire:
    """How one API writes answers: its error body (``send_error``), the guard's refusals on
    its paths (``send_refusal``: 401, 408, 413, 415), and its streams (``stream_headers``,
    an error after the stream started as a last chunk ``error_chunk(exc)`` (None: none),
    then ``tail``; a chunk ending with ``ends`` closes the stream itself), whether its
    POST bodies must be declared JSON (``json_only``), and its error body's model."""

    send_error: Callable[[Callable, Exception], Awaitable[None]]
    send_refusal: Callable[[Callable, Exception], Awaitable[None]]
    stream_headers: list[tuple[bytes, bytes]]
    error_chunk: Callable[[Exception], bytes | None]
    tail: bytes = b""
    ends: bytes | None = None
    stream_doc: str = ""  # what /openapi.json says of a stream
    json_only: bool = True  # False: POST bodies of any Content-Type (content_type.py)
    error_model: type[BaseModel] = ErrorResponse  # its error body, for /openapi.json

    @property
    def stream_media(self) -> str:
        return dict(self.stream_headers)[b"content-type"].decode().split(";")[0]


@dataclass(frozen=True, slots=True)
class Route:
    """One entry of the table. ``path`` may hold ``{name}`` segments; with ``is_prefix`` it
    serves every path under it (``method`` "*": any method). ``request`` / ``query`` /
    ``response`` are the models /openapi.json describes it with (``response`` None: a JSON
    object; ``media`` None: an empty body); ``is_open``: served without the API key."""

    method: str
    path: str
    handler: Callable[[Call], Awaitable[Answer]]
    wire: Wire
    summary: str = ""
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    media: str | None = "application/json"
    can_stream: bool = False
    is_open: bool = False
    is_prefix: bool = False
    in_schema: bool = True


OPENAI = Wire(send_error, send_error, SSE_HEADERS, sse_error_chunk, SSE_DONE.encode(),
              SSE_DONE.encode(), "with stream: true, server-sent events: one JSON chunk per "
                                 "data: line, then data: [DONE]")
"""OpenAI's shape (every route's, unless its API has its own): its error body, and streams of
server-sent events closed by ``data: [DONE]`` (after an error event too: clients stop reading
there)."""


class Router:
    """ASGI app dispatching ``routes``. A path with no route for the method gets 405 in the
    path's error shape (a prefix route with method "*" answers for every method under it);
    an unknown path gets the OpenAI 404. Every request's task is registered with ``drain``,
    whose expiry ends the responses still open (`drain`)."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self.drain = Drain()
        self.exact: dict[tuple[str, str], Route] = {}
        self.templated: list[tuple[re.Pattern, Route]] = []
        self.prefixed = [r for r in routes if r.is_prefix]
        for route in routes:
            if "{" in route.path:
                pattern = re.sub(r"\\{(\w+)\\}", r"(?P<\1>[^/]+)", re.escape(route.path))
                self.templated.append((re.compile(pattern + "$"), route))
            elif not route.is_prefix:
                assert (route.method, route.path) not in self.exact, route.path
                self.exact[route.method, route.path] = route
        self.known_paths = {path for _, path in self.exact}
        self.open_paths = {r.path for r in routes if r.is_open and not r.is_prefix}
        self.open_prefixes = tuple(r.path for r in self.prefixed if r.is_open)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await _lifespan(scope, receive, send)
        method, path = scope["method"], scope["path"]
        route, params = self.exact.get((method, path)), _NO_PARAMS
        if route is None:
            route, params = self.match(method, path)
            if route is None:
                return await self._refuse(method, path, send)
        admitted: list = []
        task = self.drain.enter()
        try:
            try:
                body = await read_body(receive) if method == "POST" else b""
                call = Call(scope, receive, body, admitted, params)
                answer = await route.handler(call)
            except Exception as exc:  # noqa: BLE001 - every error is answered with a body
                return await route.wire.send_error(send, exc)
            except asyncio.CancelledError:
                if not self.drain.took_cut():
                    raise
                return await route.wire.send_error(send, ServerDraining())
            if type(answer) is bytes:
                return await send_json(send, 200, answer, call.headers)
            if hasattr(answer, "__anext__"):
                wire = route.wire
                headers = wire.stream_headers + call.headers
                return await send_stream(answer, receive, send, headers, wire.error_chunk,
                                         wire.tail, wire.ends, self.drain)
            return await answer(scope, receive, send)
        finally:
            self.drain.leave(task)
            for ticket in admitted:
                ticket.release()

    def serves(self, method: str, path: str) -> bool:
        """Whether a route answers ``method`` on ``path`` (else: 404 or 405)."""
        return (method, path) in self.exact or self.match(method, path)[0] is not None

    def match(self, method: str, path: str) -> tuple[Route | None, dict[str, str]]:
        """The route for ``method`` (HEAD: a GET route) and ``path``, and its parameters. A
        prefix route does not answer a path that has routes of its own (a 405 there)."""
        if method in _AS_GET and (route := self.exact.get(("GET", path))) is not None:
            return route, _NO_PARAMS
        is_known = path in self.known_paths
        for pattern, route in self.templated:
            if found := pattern.match(path):
                if route.method == method:
                    return route, found.groupdict()
                is_known = True
        if is_known:
            return None, _NO_PARAMS
        for route in self.prefixed:
            if path.startswith(route.path) and route.method in ("*", method, _AS_GET.get(method)):
                return route, _NO_PARAMS
        return None, _NO_PARAMS

    def wire_for(self, path: str) -> Wire | None:
        """The error shape of ``path``'s routes (None: no route has it)."""
        for route in self.routes:
            if route.path == path or (route.is_prefix and path.startswith(route.path)):
                return route.wire
        for pattern, route in self.templated:
            if pattern.match(path):
                return route.wire
        return None

    def is_open(self, path: str) -> bool:
        """Served without the API key: probes and pages (which hold no secret)."""
        return path in self.open_paths or (path.startswith(self.open_prefixes)
                                           and ".." not in path)

    def allowed(self, path: str) -> list[str]:
        """The methods ``path``'s routes answer, sorted (a GET route answers HEAD too); a
        prefix route's only where the path has none of its own (`match`)."""
        methods = {r.method for r in self.routes if r.path == path and not r.is_prefix}
        methods.update(r.method for pattern, r in self.templated if pattern.match(path))
        if not methods:
            methods.update(r.method for r in self.prefixed
                           if path.startswith(r.path) and r.method != "*")
        if "GET" in methods:
            methods.add("HEAD")
        return sorted(methods)

    async def _refuse(self, method: str, path: str, send) -> None:
        wire = self.wire_for(path)
        if wire is None:
            return await send_error(send, OpenAIError(f"no route {method} {path}", 404,
                                                      "not_found"))
        await wire.send_error(send, MethodNotAllowed(method, path, self.allowed(path)))


class MethodNotAllowed(OpenAIError):
    """A 405, whose ``Allow`` header (`errors.error_headers`) lists the path's methods."""

    def __init__(self, method: str, path: str, allow: list[str]) -> None:
        super().__init__(f"method {method} not allowed on {path}", 405)
        self.allow = ", ".join(allow)


async def _lifespan(scope, receive, send) -> None:
    """Nothing to start or stop: the server's owner (`serve`) does both."""
    if scope["type"] != "lifespan":
        return
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            return await send({"type": "lifespan.shutdown.complete"})
