"""The browser pages' entries in the route table: the chat playground at ``/`` and the engine
view at ``/ui/engine``.

Static files from ``radixserve/frontend/ui/`` (package data; no build step, no CDN). The pages
and their scripts hold no secret, so they are served without the API key (a browser cannot
send a Bearer header when it navigates); the page asks for the key and sends it on every API
call it makes, which the guard checks as for any client.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import OPENAI, Call, Route

UI_DIR = Path(__file__).parent
UI_STATIC = "/ui/static/"
_NO_CACHE = {"Cache-Control": "no-cache"}  # revalidated (ETag): a new version shows at once


def ui_routes(not_browser) -> list[Route]:
    """The pages; ``GET /`` from a client that does not ask for HTML (Accept: text/html) goes
    to the handler ``not_browser`` instead (Ollama's liveness answer)."""
    static = StaticFiles(directory=UI_DIR / "static")

    async def playground(call: Call):
        if b"text/html" not in dict(call.scope["headers"]).get(b"accept", b""):
            return await not_browser(call)
        return FileResponse(UI_DIR / "index.html", headers=_NO_CACHE)

    async def engine_page(call: Call):
        return FileResponse(UI_DIR / "engine.html", headers=_NO_CACHE)

    async def static_file(call: Call):
        scope = {**call.scope,
                 "root_path": call.scope.get("root_path", "") + UI_STATIC.rstrip("/")}
        try:
            response = await static.get_response(static.get_path(scope), scope)
        except HTTPException:  # no such file: the answer to an unknown path
            raise OpenAIError(f"no route {scope['method']} {scope['path']}", 404,
                              "not_found") from None
        response.headers.update(_NO_CACHE)
        return response

    return [Route("GET", "/", playground, OPENAI, media="text/html", is_open=True,
                  in_schema=False),
            Route("GET", "/ui/engine", engine_page, OPENAI, media="text/html", is_open=True,
                  in_schema=False),
            Route("GET", UI_STATIC, static_file, OPENAI, is_open=True, is_prefix=True,
                  in_schema=False)]
