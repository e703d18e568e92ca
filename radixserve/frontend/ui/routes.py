"""The browser pages: the chat playground at ``/`` and the engine view at ``/ui/engine``.

Static files from ``radixserve/frontend/ui/`` (package data; no build step, no CDN). The pages
and their scripts hold no secret, so they are served without the API key (a browser cannot
send a Bearer header when it navigates); the page asks for the key and sends it on every API
call it makes, which the guard checks as for any client.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).parent
UI_PAGES = ("/", "/ui/engine")  # with UI_STATIC: what the API-key guard lets through
UI_STATIC = "/ui/static/"
_NO_CACHE = {"Cache-Control": "no-cache"}  # revalidated (ETag): a new version shows at once


def install_ui(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def playground():
        return FileResponse(UI_DIR / "index.html", headers=_NO_CACHE)

    @app.get("/ui/engine", include_in_schema=False)
    async def engine_page():
        return FileResponse(UI_DIR / "engine.html", headers=_NO_CACHE)

    app.mount(UI_STATIC.rstrip("/"), _Static(directory=UI_DIR / "static"), name="ui-static")


class _Static(StaticFiles):
    async def get_response(self, path, scope):
        response = await super().get_response(path, scope)
        response.headers.update(_NO_CACHE)
        return response
