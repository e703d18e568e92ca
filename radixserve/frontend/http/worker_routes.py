"""What a router in front of several radixserve servers asks of each (vllm-router,
sglang-router / smg): its model, its load, whether it can generate.

    GET /get_model_info    model path / name, is_generation (also /model_info: SGLang's newer
                           name, which sglang-router asks first)
    GET /get_server_info   the settings a router reads (block size, context, replicas), and
                           the load (also /server_info)
    GET /get_load          {"load": requests in flight here, ...} (power-of-two policies)
    GET /health_generate   200 once one token was generated (within 30 s), else 503

With ``--api-key`` each needs the key (a router must send it); ``/health``, ``/v1/models``
and the OpenAI generation routes are the server's own. A router with a cache-aware policy
keeps its own tree of what it sent where, of token ids when the worker renders them: vllm-router asks ``POST /v1/chat/completions/render`` (or
``/v1/completions/render``) with the request it is about to forward and reads ``token_ids``
(vLLM's field) from the answer, an object for a chat and a list (one per prompt) for a
completion; an answer without them makes it fall back to routing on the text
("Prefix input preparation unavailable" in its debug log). `rendered_prompt` is that shape.
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec
from starlette.responses import JSONResponse

from radixserve import __version__
from radixserve.frontend.http.protocol_base import error_body
from radixserve.frontend.http.router import OPENAI, Call, Route
from radixserve.sampling_params import SamplingParams

_ENCODE = msgspec.json.encode
_HEALTH_GENERATE_TIMEOUT_S = 30.0
_probe_ids = itertools.count()


def worker_routes(ctx) -> list[Route]:
    client = ctx.engine.client

    async def model_info(call: Call):
        return _ENCODE({"model_path": ctx.model_name, "tokenizer_path": ctx.model_name,
                        "served_model_name": ctx.model_name, "is_generation": True,
                        "max_model_len": ctx.max_model_len})

    async def server_info(call: Call):
        ready = client.ready
        return _ENCODE({"version": __version__, "model_path": ctx.model_name,
                        "served_model_name": ctx.model_name, "max_model_len": ctx.max_model_len,
                        "block_size": ready.block_size if ready else None,
                        "page_size": ready.block_size if ready else None,
                        "data_parallel_size": len(client.replicas),
                        "dp_size": len(client.replicas), "load": client.load()})

    async def get_load(call: Call):
        load = client.load()
        return _ENCODE({"load": load["num_pending_requests"],
                        "num_requests_running": load["num_requests_running"],
                        "num_requests_waiting": load["num_requests_waiting"],
                        "data_parallel_size": load["data_parallel_size"]})

    async def health_generate(call: Call):
        if client.dead:
            return _unavailable(f"engine unavailable: {client.dead}")
        params = SamplingParams(max_tokens=1, temperature=0.0)
        try:
            async with asyncio.timeout(_HEALTH_GENERATE_TIMEOUT_S):
                async for _ in ctx.engine.generate([0], params,
                                                   f"health-generate-{next(_probe_ids)}"):
                    pass
        except TimeoutError:
            return _unavailable(f"no token within {_HEALTH_GENERATE_TIMEOUT_S:.0f} s")
        except Exception as exc:  # noqa: BLE001 - whatever failed, the answer is "unhealthy"
            return _unavailable(f"generation failed: {exc}")
        return _ENCODE({"status": "ok"})

    # NOTE: none is open: with --api-key a router sends the key here as on every route
    # (the model, settings and load are the server's data; only the probes are open)
    return [Route("GET", "/get_model_info", model_info, OPENAI, "The model, for routers"),
            Route("GET", "/get_server_info", server_info, OPENAI,
                  "The settings a router reads, and the load"),
            Route("GET", "/model_info", model_info, OPENAI, in_schema=False),
            Route("GET", "/server_info", server_info, OPENAI, in_schema=False),
            Route("GET", "/get_load", get_load, OPENAI, "Requests in flight here"),
            Route("GET", "/health_generate", health_generate, OPENAI,
                  "200 once one token was generated (within 30 s), else 503")]


def rendered_prompt(model: str, text: str, ids: list[int]) -> dict:
    """One rendered prompt as the render endpoints answer it: vLLM's ``token_ids`` and
    ``model`` (what routers read), our ``prompt`` (the text), ``prompt_token_ids`` and
    ``count``."""
    return {"model": model, "token_ids": ids, "prompt": text, "prompt_token_ids": ids,
            "count": len(ids)}


def _unavailable(message: str) -> JSONResponse:
    return JSONResponse(error_body(message, "service_unavailable", None, 503), status_code=503)
