"""Loading and unloading LoRA adapters at run time, with vLLM's endpoints and bodies.

    POST /v1/load_lora_adapter     {"lora_name": NAME, "lora_path": PATH}
         200 text "Success: LoRA adapter 'NAME' added successfully."
         400 the name is taken, or the adapter does not fit the base model (shape, rank,
             architecture, an unsupported target); 404 no adapter at PATH
    POST /v1/unload_lora_adapter   {"lora_name": NAME}
         200 text "Success: LoRA adapter 'NAME' removed successfully."
         404 no such adapter; 400 while unfinished requests use it

The engine checks and loads (engine/lora_registry.py); the API process keeps the names for
routing (``ServingContext.loras``) once the engine has answered. vLLM mounts these only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; here they are always mounted and, like every route that
is not a probe, need the API key when the server has one. With data parallel every live
replica loads it (one restarted later has only its ``--lora`` adapters).
"""

from __future__ import annotations

import logging

from starlette.responses import PlainTextResponse

from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.protocol_base import OpenAIError, OpenAIRequest
from radixserve.frontend.http.router import OPENAI, Call, Route

logger = logging.getLogger(__name__)


class LoadLoraAdapterRequest(OpenAIRequest):
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(OpenAIRequest):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; accepted and ignored


def lora_routes(ctx) -> list[Route]:
    """The two routes over ``ctx`` (a `ServingContext`), updating ``ctx.loras``."""

    async def call(name: str, path: str | None):
        reply = await ctx.engine.client.lora_call(name, path)
        if reply.error is not None:
            kind = "NotFoundError" if reply.status == 404 else "BadRequestError"
            raise OpenAIError(reply.error, reply.status, kind, "lora_name")

    async def load(call_: Call):
        body = parse_body(LoadLoraAdapterRequest, call_.body)
        if body.lora_name == ctx.model_name:
            raise OpenAIError(f"{body.lora_name!r} is the base model's name", param="lora_name")
        await call(body.lora_name, body.lora_path)
        ctx.loras[body.lora_name] = body.lora_path
        logger.info("LoRA adapter %r loaded from %s", body.lora_name, body.lora_path)
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
