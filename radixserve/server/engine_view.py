"""``GET /v1/engine/state``: the engine view's data, one bounded JSON object.

The engine part comes from the engine process on demand (`EngineCoreClient.engine_state`,
shared by concurrent pollers and reused for a quarter second); the API process adds what only
it knows: each request's age, the cache nodes' token previews (decoded here: the engine works
on ids) and the metrics' running totals, from which the page draws throughput and latency
sparklines by differencing successive polls.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI

from radixserve.engine.core_client import EngineDeadError
from radixserve.engine.messages import EngineState, RequestInfo
from radixserve.server.serving import OpenAIError, ServingContext

_TOTALS = (  # (JSON name, Prometheus sample name without the model label)
    ("prompt_tokens", "radixserve:prompt_tokens_total"),
    ("generation_tokens", "radixserve:generation_tokens_total"),
    ("ttft_sum", "radixserve:time_to_first_token_seconds_sum"),
    ("ttft_count", "radixserve:time_to_first_token_seconds_count"),
    ("itl_sum", "radixserve:inter_token_latency_seconds_sum"),
    ("itl_count", "radixserve:inter_token_latency_seconds_count"),
    ("e2e_sum", "radixserve:e2e_request_latency_seconds_sum"),
    ("e2e_count", "radixserve:e2e_request_latency_seconds_count"),
)


def install_engine_view(app: FastAPI, ctx: ServingContext, metrics) -> None:
    client = ctx.engine.client

    @app.get("/v1/engine/state")
    async def engine_state():
        try:
            state = await client.engine_state()
        except EngineDeadError as exc:
            raise OpenAIError(f"engine unavailable: {exc}", 503, "service_unavailable") from None
        except asyncio.TimeoutError:
            raise OpenAIError("the engine did not answer within 5 s (a long step?)", 503,
                              "service_unavailable") from None
        return state_json(state, ctx, metrics)


def state_json(state: EngineState, ctx: ServingContext, metrics) -> dict:
    now = time.time()
    pool_used = state.num_kv_blocks - state.num_free_blocks - state.num_evictable_blocks
    decode = ctx.tokenizer.decode
    return {
        "model": ctx.model_name,
        "time": now,
        "num_running": state.num_running,
        "num_waiting": state.num_waiting,
        "running": [_request(r, now) for r in state.running],
        "waiting": [_request(r, now) for r in state.waiting],
        "kv": {"num_blocks": state.num_kv_blocks, "used": pool_used,
               "cached_evictable": state.num_evictable_blocks, "free": state.num_free_blocks,
               "cached": state.num_cached_blocks, "block_size": state.block_size},
        "prefix_cache": {
            "query_tokens": state.prefix_query_tokens, "hit_tokens": state.prefix_hit_tokens,
            "hit_rate": (state.prefix_hit_tokens / state.prefix_query_tokens
                         if state.prefix_query_tokens else 0.0),
            "num_nodes": state.num_cache_nodes,
            "nodes": [{"parent": n.parent, "depth": n.depth, "num_tokens": n.num_tokens,
                       "num_blocks": n.num_blocks, "hits": n.hits, "lock_ref": n.lock_ref,
                       "num_children": n.num_children,
                       "num_hidden_children": n.num_hidden_children,
                       "preview": decode(n.head, skip_special_tokens=False)}
                      for n in state.cache_nodes],
        },
        "num_preemptions": state.num_preemptions,
        "summary_us": round(state.summary_us, 1),
        "totals": _totals(metrics),
    }


def _request(r: RequestInfo, now: float) -> dict:
    return {"id": r.request_id, "status": r.status, "computed": r.num_computed_tokens,
            "tokens": r.num_tokens, "prompt_tokens": r.num_prompt_tokens,
            "output_tokens": r.num_tokens - r.num_prompt_tokens, "max_tokens": r.max_tokens,
            "priority": r.priority, "age_s": round(max(0.0, now - r.arrival_time), 3),
            "cached_tokens": r.num_cached_tokens, "preemptions": r.num_preemptions}


def _totals(metrics) -> dict:
    """The running totals, read in one pass over the registry."""
    wanted = {sample: name for name, sample in _TOTALS}
    totals = dict.fromkeys(wanted.values(), 0.0)
    totals["requests_finished"] = 0.0
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name in wanted:
                totals[wanted[s.name]] = s.value
            elif s.name == "radixserve:request_success_total":
                totals["requests_finished"] += s.value
    return totals
