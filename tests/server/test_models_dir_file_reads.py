"""The hub's Ollama listing reads GGUF metadata off the event loop, and a GGUF whose counts lie
is listed (details unknown) at once (issue 62 item 4: a string array declaring 2^62 items froze
the API's event loop on /api/tags until memory ran out)."""

from __future__ import annotations

import asyncio
import time

from hostile_gguf import huge_string_array, string_array
from test_models_dir_hub import make_hub

from radixserve.frontend.http.router import Call
from radixserve.frontend.models_dir.hub_routes import hub_routes

_BIG_VOCAB = 400_000  # strings: a parse long enough (~0.5 s) to see on the event loop


async def _get(routes, path: str) -> dict:
    import msgspec

    route = next(r for r in routes if r.method == "GET" and r.path == path)
    body = await route.handler(Call({"path": path, "headers": []}, None, b"", [], {}))
    return msgspec.json.decode(body)


async def _max_tick_gap(until: asyncio.Future) -> float:
    """The longest the event loop went without running this coroutine until ``until``."""
    last, worst = time.monotonic(), 0.0
    while not until.done():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


def _folder_with(tmp_path, files: dict[str, bytes]):
    hub, _ = make_hub(tmp_path, {})
    for name, raw in files.items():
        (tmp_path / "models" / f"{name}.gguf").write_bytes(raw)
    return hub


def test_a_lying_gguf_is_listed_at_once(tmp_path):
    hub = _folder_with(tmp_path, {"hostile": huge_string_array()})

    async def main():
        start = time.monotonic()
        tags = await asyncio.wait_for(_get(hub_routes(hub), "/api/tags"), 10)
        assert time.monotonic() - start < 2
        return {m["name"]: m for m in tags["models"]}

    models = asyncio.run(main())
    assert models["hostile:latest"]["details"]["format"] == "unknown"


def test_tags_parse_big_metadata_off_the_event_loop(tmp_path):
    hub = _folder_with(tmp_path, {"big": string_array(_BIG_VOCAB, ["tok"] * _BIG_VOCAB)})

    async def main():
        tags = asyncio.ensure_future(_get(hub_routes(hub), "/api/tags"))
        gap = await _max_tick_gap(tags)
        return (await tags)["models"], gap

    models, gap = asyncio.run(main())
    assert [m["name"] for m in models] == ["big:latest", "junk:latest"]
    assert models[0]["details"]["family"] == "llama"
    assert gap < 0.2, f"the event loop stalled {gap:.2f} s while /api/tags parsed"

