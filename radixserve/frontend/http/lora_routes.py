"""Loading and unloading LoRA adapters at run time, with vLLM's endpoints and bodies.

    POST /v1/load_lora_adapter     {"lora_name": NAME, "lora_path": PATH}
         200 text "Success: LoRA adapter 'NAME' added successfully."
         400 the name is taken, or the adapter does not fit the base model (shape, rank,
             architecture, an unsupported target) or is not an adapter at all (a random or
             truncated file, a config without a positive ``r``); 404 no adapter at PATH
    POST /v1/unload_lora_adapter   {"lora_name": NAME}
         200 text "Success: LoRA adapter 'NAME' removed successfully."
         404 no such adapter; 400 while unfinished requests use it

Mounted only with ``--enable-lora-runtime-updates`` (vLLM's gate is the environment variable
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), which needs ``--lora-adapters-dir DIR``: ``lora_path``
is read relative to DIR, and one whose real path (symbolic links followed) leaves DIR is a
400 that is the same whatever the path, so a client learns nothing about files outside it
(vLLM reads any path the server can). Like every route that is not a probe, they need the
API key when the server has one.

The API process checks the adapter's files against the base model first (models/lora_check.py,
torch-free: headers and config only), so a malformed one never reaches the engine; the engine
checks again and loads (engine/lora_registry.py), and a load that fails there fails alone.
The API process keeps the names for routing (``ServingContext.loras``) once the engine has
answered. With data parallel every live replica loads it; an engine restarted later is given
the adapters loaded at run time again (cluster/runtime_loras.py), and one it can no longer
load (its files changed since) leaves ``ctx.loras`` too.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from starlette.responses import PlainTextResponse

from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.protocol_base import OpenAIError, OpenAIRequest
from radixserve.frontend.http.router import OPENAI, Call, Route
from radixserve.models.lora_check import check_lora_adapter, lora_base_config

logger = logging.getLogger(__name__)


class LoadLoraAdapterRequest(OpenAIRequest):
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(OpenAIRequest):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; accepted and ignored


@dataclass(frozen=True)
class LoraUpdates:
    """Run-time adapter loads are on, reading adapters from ``adapters_dir`` only (a real
    path: no symbolic link in it)."""

    adapters_dir: str

    def confine(self, path: str) -> str:
        """The real path of ``path`` (relative: to the folder); 400 unless it is inside the
        folder, the same error whatever ``path`` is or whether it exists."""
        try:
            full = os.path.realpath(os.path.join(self.adapters_dir, path))
            if os.path.commonpath([full, self.adapters_dir]) == self.adapters_dir:
                return full
        except ValueError:  # a NUL byte, or a path on another drive
            pass
        raise OpenAIError("lora_path must name an adapter inside the server's "
                          "--lora-adapters-dir", param="lora_path")


def lora_updates(enabled: bool, adapters_dir: str | None) -> LoraUpdates | None:
    """``--enable-lora-runtime-updates`` and ``--lora-adapters-dir``: None when off;
    ValueError for one without the other or a folder that is not one."""
    if not enabled:
        if adapters_dir is not None:
            raise ValueError("--lora-adapters-dir is used only with "
                             "--enable-lora-runtime-updates")
        return None
    if adapters_dir is None:
        raise ValueError("--enable-lora-runtime-updates needs --lora-adapters-dir DIR: the "
                         "folder run-time adapters are loaded from (no other path is read)")
    if not os.path.isdir(adapters_dir):
        raise ValueError(f"--lora-adapters-dir {adapters_dir}: not a folder")
    return LoraUpdates(os.path.realpath(adapters_dir))


def lora_routes(ctx, updates: LoraUpdates) -> list[Route]:
    """The two routes over ``ctx`` (a `ServingContext`), updating ``ctx.loras``; adapters
    are read from ``updates.adapters_dir`` only."""
    runtime = getattr(getattr(ctx.engine, "client", None), "loras", None)  # a `RuntimeLoras`
    if runtime is not None:  # an adapter a restarted engine could not load again
        runtime.on_forgotten.append(lambda name: ctx.loras.pop(name, None))

    async def check(path: str) -> None:
        """404 / 400 naming what is wrong with the adapter at ``path``, before the engine
        sees it (off the event loop: it reads files)."""
        if ctx.model_path is None:  # no base to check against: the engine's checks alone
            return
        try:
            await asyncio.to_thread(check_adapter_fits, ctx.model_path, path)
        except FileNotFoundError as exc:
            raise OpenAIError(str(exc), 404, "NotFoundError", "lora_path") from None
        except (ValueError, OSError) as exc:
            raise OpenAIError(str(exc) if isinstance(exc, ValueError)
                              else f"{type(exc).__name__}: {exc}", 400, "BadRequestError",
                              "lora_path") from None

    async def call(name: str, path: str | None):
        reply = await ctx.engine.client.lora_call(name, path)
        if reply.error is not None:
            kind = "NotFoundError" if reply.status == 404 else "BadRequestError"
            raise OpenAIError(reply.error, reply.status, kind, "lora_name")

    async def load(call_: Call):
        body = parse_body(LoadLoraAdapterRequest, call_.body)
        if body.lora_name == ctx.model_name:
            raise OpenAIError(f"{body.lora_name!r} is the base model's name", param="lora_name")
        if not body.lora_name.strip():
            raise OpenAIError("lora_name must not be empty", param="lora_name")
        path = updates.confine(body.lora_path)
        await check(path)
        await call(body.lora_name, path)
        ctx.loras[body.lora_name] = path
        logger.info("LoRA adapter %r loaded from %s", body.lora_name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added "
                                 "successfully.")

    async def unload(call_: Call):
        body = parse_body(UnloadLoraAdapterRequest, call_.body)
        await call(body.lora_name, None)
        ctx.loras.pop(body.lora_name, None)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed "
                                 "successfully.")

    return [Route("POST", "/v1/load_lora_adapter", load, OPENAI,
                  "Load a LoRA adapter (vLLM's): a PEFT folder or a GGUF LoRA file",
                  LoadLoraAdapterRequest, media="text/plain"),
            Route("POST", "/v1/unload_lora_adapter", unload, OPENAI,
                  "Unload a LoRA adapter (vLLM's)", UnloadLoraAdapterRequest,
                  media="text/plain")]


def check_adapter_fits(model_path: str, path: str) -> None:
    """FileNotFoundError / ValueError unless the adapter at ``path`` fits the base model at
    ``model_path`` (`check_lora_adapter`); blocking."""
    check_lora_adapter(path, lora_base_config(model_path))
