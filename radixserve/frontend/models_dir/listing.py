"""What the hub's model routes say about each model of the folder: OpenAI / Anthropic model
cards and Ollama's /api/tags and /api/ps entries, each with its state (``loaded``, ``loading``,
``unloading``, ``unloaded``).

A GGUF's metadata is parsed in a worker thread (``read_infos``, ``ollama_show``'s callers), never
on the event loop: a big vocabulary takes a second to walk, and while it is walked every other
request would wait."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import math
import os

from radixserve.frontend.models_dir.catalog import ModelEntry
from radixserve.frontend.models_dir.hub import Slot


def state_of(slot: Slot | None) -> str:
    return "unloaded" if slot is None else slot.state


def openai_card(entry: ModelEntry, slot: Slot | None) -> dict:
    """OpenAI's model object; ``status.value`` as llama-server's router mode reports it."""
    card = {"id": entry.name, "object": "model", "created": _mtime(entry),
            "owned_by": "radixserve", "status": {"value": state_of(slot)}}
    if slot is not None and slot.served is not None:
        card["max_model_len"] = slot.served.max_model_len
    return card


def anthropic_card(entry: ModelEntry, slot: Slot | None) -> dict:
    return {"type": "model", "id": entry.name, "display_name": entry.name,
            "created_at": _rfc3339(_mtime(entry)), "state": state_of(slot)}


async def read_infos(entries: list[ModelEntry]) -> list:
    """Each entry's ``OllamaModelInfo`` (from its files; cached while they are unchanged), read
    in a worker thread; for ``ollama_tag`` and ``ollama_ps``."""
    return await asyncio.to_thread(lambda: [_info(e) for e in entries])


def ollama_tag(entry: ModelEntry, slot: Slot | None, info) -> dict:
    """An /api/tags entry (Ollama's fields, plus ``state``); ``info``: from ``read_infos``."""
    return {"name": info.name, "model": info.name, "modified_at": info.modified_at,
            "size": info.size, "digest": info.digest, "details": info.details(),
            "state": state_of(slot)}


def ollama_ps(entry: ModelEntry, slot: Slot, info) -> dict:
    """An /api/ps entry: a model loaded or loading (``expires_at`` far away when pinned)."""
    expires = slot.expires_at
    served = slot.served
    return {**ollama_tag(entry, slot, info), "expires_at": _expiry(expires),
            "size_vram": 0, "context_length": served.max_model_len if served else 0}


FOREVER = "2318-01-01T00:00:00Z"  # what Ollama shows for a pinned model (Go's longest duration)


def _expiry(expires: float | None) -> str:
    """``expires_at`` for /api/ps: never an exception (a time past what a date can hold
    reads as forever), so one model's keep_alive cannot break the listing for everyone."""
    if expires is None or not math.isfinite(expires):
        return FOREVER
    try:
        return _rfc3339(expires)
    except (OverflowError, OSError, ValueError):
        return FOREVER


def ollama_show(entry: ModelEntry) -> dict:
    """/api/show of a model not loaded, from its files alone (so listing clients that show
    every model do not load them all): capabilities are only known once it is loaded.
    Parses the model's files: call it in a worker thread."""
    info = _info(entry)
    return {"modelfile": f"FROM {info.name}\n", "parameters": "",
            "template": _chat_template(entry), "details": info.details(),
            "model_info": info.info, "capabilities": ["completion"],
            "modified_at": info.modified_at}


def _chat_template(entry: ModelEntry) -> str:
    """The chat template in the model's files ("" when none can be read)."""
    try:
        if entry.kind == "gguf":
            from radixserve.gguf_reader import open_gguf

            field = open_gguf(entry.path).fields.get("tokenizer.chat_template")
            template = field.contents() if field is not None else ""
        else:
            with open(os.path.join(entry.path, "tokenizer_config.json")) as f:
                template = json.load(f).get("chat_template", "")
    except Exception:  # noqa: BLE001 - a broken file: loading it says why
        return ""
    return template if isinstance(template, str) else ""


def _info(entry: ModelEntry):
    return _ollama_info(entry.path, entry.name, _mtime(entry))


@functools.lru_cache(maxsize=256)
def _ollama_info(path: str, name: str, mtime: float):
    from radixserve.frontend.ollama.models import read_model_info

    try:
        return read_model_info(path, name, 0)
    except Exception:  # noqa: BLE001 - a broken file is still listed (loading it says why)
        return read_model_info(None, name, 0)


def _mtime(entry: ModelEntry) -> int:
    try:
        return int(os.path.getmtime(entry.path))
    except OSError:
        return 0


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat().replace("+00:00",
                                                                                    "Z")
