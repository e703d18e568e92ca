"""What the engine holds right now, as one bounded `EngineState` (the engine view's data).

Built only when asked (an ``EngineStateQuery``), never per step. Its cost: the listed
requests (at most ``max_requests`` of each kind) plus the radix summary (`radix_summary`);
the totals are counters the scheduler and KV manager keep anyway.
"""

from __future__ import annotations

import itertools
import time

from radixserve.core.reports import EngineState, RequestInfo
from radixserve.core.request import Request


def engine_state(scheduler, query) -> EngineState:
    """``scheduler``: a `Scheduler` (its ``running``, ``waiting`` and ``kv``); ``query``: the
    limits (an ``EngineStateQuery``: ``max_requests``, ``max_nodes``, ``max_depth``). Read-only."""
    start = time.perf_counter()
    kv = scheduler.kv
    cache, pool = kv.prefix_cache, kv.block_pool
    state = EngineState(
        [_info(r, "running") for r in itertools.islice(scheduler.running, query.max_requests)],
        [_info(r, "waiting") for r in itertools.islice(scheduler.waiting, query.max_requests)],
        len(scheduler.running), len(scheduler.waiting), pool.num_blocks, pool.num_free_blocks,
        cache.num_evictable_blocks, cache.num_cached_blocks, kv.block_size,
        cache.summary(query.max_nodes, query.max_depth), cache.num_nodes,
        kv.num_query_tokens, kv.num_hit_tokens, scheduler.num_preemptions)
    state.summary_us = (time.perf_counter() - start) * 1e6
    return state


def _info(request: Request, status: str) -> RequestInfo:
    return RequestInfo(request.request_id, status, request.num_computed_tokens,
                       request.num_tokens, request.num_prompt_tokens, request.max_tokens,
                       request.priority, request.arrival_time, request.num_cached_tokens,
                       request.num_preemptions)
