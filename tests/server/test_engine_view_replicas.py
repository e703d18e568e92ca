"""`/v1/engine/state` under data parallel, from fake replica states: each replica's own view
tagged with its index, the top level their sum (counts added, requests and cache nodes listed
together, a node's parent re-indexed into the combined list), a replica that did not answer
shown down with why and left out of the sum; one replica's view is the top level as before."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from radixserve.frontend.core_client import EngineDeadError
from radixserve.core.reports import CacheNodeInfo, EngineState, RequestInfo
from radixserve.frontend.http.engine_view import state_json

CTX = SimpleNamespace(model_name="tiny",
                      tokenizer=SimpleNamespace(decode=lambda ids, **_: f"<{len(ids)}>"))
METRICS = SimpleNamespace(registry=CollectorRegistry())


def _state(num_running: int, blocks: int, free: int, evictable: int, queries: int, hits: int,
           num_nodes: int) -> EngineState:
    running = [RequestInfo(f"r{num_running}-{i}", "running", 3, 8, 5, 10, 0, time.time())
               for i in range(num_running)]
    # a root child and its child: parents -1 and 0
    nodes = [CacheNodeInfo(-1, 0, 32, 2, 1, 0, 1, 0, [1, 2]),
             CacheNodeInfo(0, 1, 16, 1, 0, 1, 0, 0, [3])][:num_nodes]
    return EngineState(running, [], num_running, 1, blocks, free, evictable, evictable + 1, 16,
                       nodes, num_nodes, queries, hits, num_running)


def test_two_replicas_each_their_own_view_and_summed():
    s = state_json([_state(2, 100, 60, 10, 400, 100, 2), _state(1, 50, 40, 5, 100, 100, 2)],
                   CTX, METRICS)
    assert s["data_parallel_size"] == 2
    assert [r["replica"] for r in s["replicas"]] == [0, 1]
    assert [r["up"] for r in s["replicas"]] == [True, True]
    assert [r["num_running"] for r in s["replicas"]] == [2, 1]
    assert s["num_running"] == 3 and s["num_waiting"] == 2 and s["num_preemptions"] == 3
    assert [r["replica"] for r in s["running"]] == [0, 0, 1]
    assert s["kv"] == {"num_blocks": 150, "used": 150 - 100 - 15, "cached_evictable": 15,
                       "free": 100, "cached": 17, "block_size": 16}
    assert s["replicas"][0]["kv"]["used"] == 30
    pc = s["prefix_cache"]
    assert (pc["query_tokens"], pc["hit_tokens"], pc["hit_rate"]) == (500, 200, 0.4)
    assert s["replicas"][1]["prefix_cache"]["hit_rate"] == 1.0
    assert [(n["replica"], n["parent"]) for n in pc["nodes"]] == [(0, -1), (0, 0), (1, -1),
                                                                 (1, 2)]
    assert pc["num_nodes"] == 4 and pc["nodes"][0]["preview"] == "<2>"


def test_a_replica_down_is_shown_with_why_and_left_out_of_the_sum():
    s = state_json([EngineDeadError("replica 0: the engine process exited with code -9"),
                    _state(1, 50, 40, 5, 100, 100, 1)], CTX, METRICS)
    assert s["replicas"][0] == {"replica": 0, "up": False, "error": "engine unavailable: "
                                "replica 0: the engine process exited with code -9"}
    assert s["num_running"] == 1 and s["kv"]["num_blocks"] == 50
    assert [n["parent"] for n in s["prefix_cache"]["nodes"]] == [-1]
    s = state_json([_state(1, 50, 40, 5, 100, 100, 1), TimeoutError()], CTX, METRICS)
    assert s["replicas"][1]["error"] == "no answer within 5 s (a long step?)"


def test_one_replica_is_the_top_level_view():
    s = state_json([_state(2, 100, 60, 10, 400, 100, 2)], CTX, METRICS)
    assert s["data_parallel_size"] == 1 and len(s["replicas"]) == 1
    assert {k: s[k] for k in ("num_running", "kv", "prefix_cache")} == \
        {k: s["replicas"][0][k] for k in ("num_running", "kv", "prefix_cache")}
    assert "totals" in s and s["model"] == "tiny"
