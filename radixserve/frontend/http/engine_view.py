"""``GET /v1/engine/state``: the engine view's data, one bounded JSON object.

The engine part comes from each data-parallel replica's engine process on demand
(`EngineCoreClient.engine_state`, all replicas asked at once, each answer shared by concurrent
pollers and reused for a quarter second), per replica and summed (`state_json`); the API
process adds what only it knows: each request's age, the cache nodes' token previews (decoded
here: the engine works on ids) and the metrics' running totals, from which the page draws throughput and latency
sparklines by differencing successive polls.
"""

from __future__ import annotations

import time

import msgspec

from radixserve.frontend.core_client import EngineDeadError
from radixserve.core.reports import EngineState, RequestInfo
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import OPENAI, Call, Route
from radixserve.frontend.openai.serving import ServingContext

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


def engine_view_routes(ctx: ServingContext, metrics) -> list[Route]:
    client = ctx.engine.client

    async def engine_state(call: Call):
        states = await client.engine_states()
        if not any(isinstance(s, EngineState) for s in states):
            if client.dead:
                raise OpenAIError(f"engine unavailable: {client.dead}", 503,
                                  "service_unavailable")
            raise OpenAIError(f"the engine did not answer: {_why(states[0])}", 503,
                              "service_unavailable")
        return msgspec.json.encode(state_json(states, ctx, metrics))

    return [Route("GET", "/v1/engine/state", engine_state, OPENAI, "The engine view's data")]


def state_json(states: list, ctx: ServingContext, metrics) -> dict:
    """The view of ``states`` (one per data-parallel replica: an `EngineState`, or the
    exception it answered). ``replicas`` has each replica's own view, tagged with its index
    (one that did not answer: ``up`` false and why); the top level is their sum over those
    that answered: counts added, requests and cache nodes listed together, each tagged with
    its replica (a node's ``parent`` indexes the combined list, so each replica's tree hangs
    off the one root). With one replica the top level is its view."""
    now = time.time()
    decode = ctx.tokenizer.decode
    replicas = [_replica(i, s, decode, now) if isinstance(s, EngineState)
                else {"replica": i, "up": False, "error": _why(s)} for i, s in enumerate(states)]
    live = [r for r in replicas if r["up"]]
    summary = live[0] if len(live) == 1 else _summed(live)
    return {"model": ctx.model_name, "time": now, "data_parallel_size": len(states),
            **{k: v for k, v in summary.items() if k not in ("replica", "up")},
            "replicas": replicas, "totals": _totals(metrics)}


def _why(exc: BaseException) -> str:
    if isinstance(exc, EngineDeadError):
        return f"engine unavailable: {exc}"
    if isinstance(exc, TimeoutError):
        return "no answer within 5 s (a long step?)"
    return f"{type(exc).__name__}: {exc}"


def _replica(index: int, state: EngineState, decode, now: float) -> dict:
    pool_used = state.num_kv_blocks - state.num_free_blocks - state.num_evictable_blocks
    return {
        "replica": index,
        "up": True,
        "num_running": state.num_running,
        "num_waiting": state.num_waiting,
        "running": [_request(r, index, now) for r in state.running],
        "waiting": [_request(r, index, now) for r in state.waiting],
        "kv": {"num_blocks": state.num_kv_blocks, "used": pool_used,
               "cached_evictable": state.num_evictable_blocks, "free": state.num_free_blocks,
               "cached": state.num_cached_blocks, "block_size": state.block_size},
        "prefix_cache": {
            "query_tokens": state.prefix_query_tokens, "hit_tokens": state.prefix_hit_tokens,
            "hit_rate": _rate(state.prefix_hit_tokens, state.prefix_query_tokens),
            "num_nodes": state.num_cache_nodes,
            "nodes": [{"replica": index, "parent": n.parent, "depth": n.depth,
                       "num_tokens": n.num_tokens, "num_blocks": n.num_blocks,
                       "hits": n.hits, "lock_ref": n.lock_ref,
                       "num_children": n.num_children,
                       "num_hidden_children": n.num_hidden_children,
                       "snapshot": n.snapshot,
                       "preview": decode(n.head, skip_special_tokens=False)}
                      for n in state.cache_nodes],
        },
        "num_preemptions": state.num_preemptions,
        "summary_us": round(state.summary_us, 1),
    }


def _summed(views: list[dict]) -> dict:
    """Several replicas' views as one (see `state_json`)."""
    def total(get) -> int:
        return sum(get(v) for v in views)

    kv = {k: total(lambda v, k=k: v["kv"][k])
          for k in ("num_blocks", "used", "cached_evictable", "free", "cached")}
    kv["block_size"] = views[0]["kv"]["block_size"]
    nodes = []
    for v in views:
        offset = len(nodes)
        nodes += [{**n, "parent": n["parent"] + offset if n["parent"] >= 0 else n["parent"]}
                  for n in v["prefix_cache"]["nodes"]]
    query = total(lambda v: v["prefix_cache"]["query_tokens"])
    hits = total(lambda v: v["prefix_cache"]["hit_tokens"])
    return {
        "num_running": total(lambda v: v["num_running"]),
        "num_waiting": total(lambda v: v["num_waiting"]),
        "running": [r for v in views for r in v["running"]],
        "waiting": [r for v in views for r in v["waiting"]],
        "kv": kv,
        "prefix_cache": {"query_tokens": query, "hit_tokens": hits,
                         "hit_rate": _rate(hits, query),
                         "num_nodes": total(lambda v: v["prefix_cache"]["num_nodes"]),
                         "nodes": nodes},
        "num_preemptions": total(lambda v: v["num_preemptions"]),
        "summary_us": max(v["summary_us"] for v in views),
    }


def _rate(hits: int, queries: int) -> float:
    return hits / queries if queries else 0.0


def _request(r: RequestInfo, replica: int, now: float) -> dict:
    return {"id": r.request_id, "replica": replica, "status": r.status,
            "computed": r.num_computed_tokens, "tokens": r.num_tokens, "prompt_tokens": r.num_prompt_tokens,
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
