"""The engine view's data: radix-node hit counts, the bounded tree summary, `engine_state`."""

from __future__ import annotations

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.scheduler import Scheduler
from radixserve.core.state_summary import engine_state
from radixserve.core.reports import EngineState
from radixserve.messages import EngineStateQuery
from radixserve.sampling_params import SamplingParams
import msgspec


def serve(cache, pool, tokens):
    m = cache.match_prefix(tokens)
    cache.lock(m.handle)
    pool.share(m.block_ids)
    blocks = m.block_ids + pool.allocate(-(-len(tokens) // cache.block_size) - len(m.block_ids))
    cache.release(tokens, blocks, m.handle)
    cache.check_integrity()


def test_hits_count_matches_through_a_node_and_survive_a_split():
    pool = BlockPool(32)
    cache = RadixCache(pool, 2)
    serve(cache, pool, [1, 2, 3, 4, 5, 6])
    serve(cache, pool, [1, 2, 3, 4, 5, 6, 7, 8])  # matches the whole first node
    serve(cache, pool, [1, 2, 3, 4, 9, 9])  # splits it after [1 2 3 4]
    nodes = cache.summary(max_nodes=10, max_depth=4)
    got = [(n.parent, n.depth, n.head, n.hits, n.lock_ref, n.num_children) for n in nodes]
    assert got == [(-1, 0, [1, 2, 3, 4], 2, 0, 2),
                   (0, 1, [5, 6], 1, 0, 1),  # the lower half kept its hit
                   (0, 1, [9, 9], 0, 0, 0),
                   (1, 2, [7, 8], 0, 0, 0)]
    assert cache.cached_len([1, 2, 3, 4]) == 4  # side-effect free: no hit counted
    assert cache.summary(10, 4)[0].hits == 2


def test_summary_is_bounded_and_shows_locks():
    pool = BlockPool(256)
    cache = RadixCache(pool, 1)
    for i in range(40):
        serve(cache, pool, [0, i, 1])  # one shared page, 40 children under it
    held = cache.match_prefix([0, 7, 1])
    cache.lock(held.handle)
    nodes = cache.summary(max_nodes=5, max_depth=4)
    assert len(nodes) == 5 and cache.num_nodes == 41
    top = nodes[0]
    assert (top.head, top.hits, top.lock_ref, top.num_children) == ([0], 40, 1, 40)
    assert top.num_hidden_children == 40 - 4
    assert nodes[1].head == [7, 1] and nodes[1].lock_ref == 1  # most hits first
    (only,) = cache.summary(max_nodes=50, max_depth=1)
    assert only.head == [0] and only.num_hidden_children == 40
    cache.unlock(held.handle)


def test_engine_state_lists_requests_and_the_pool_and_round_trips():
    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(2, 64), kv, 256)
    for i in range(3):
        s.add_request(Request(f"r{i}", list(range(10 * i + 1, 10 * i + 11)),
                              SamplingParams(max_tokens=5),
                              frozenset(), seed=0, arrival_time=100.0 + i, priority=i,
                              max_tokens=5))
    s.schedule()  # two run (max_num_seqs 2), one waits; nothing computed yet
    state = engine_state(s, EngineStateQuery(max_requests=1))
    assert (state.num_running, state.num_waiting) == (2, 1)
    assert [r.request_id for r in state.running] == ["r0"]  # at most max_requests listed
    r = state.running[0]
    assert (r.status, r.num_tokens, r.num_prompt_tokens, r.max_tokens, r.priority,
            r.arrival_time) == ("running", 10, 10, 5, 0, 100.0)
    assert state.waiting[0].request_id == "r2" and state.waiting[0].status == "waiting"
    assert state.num_kv_blocks == 64
    assert state.num_free_blocks == 64 - 2 * 3  # 3 blocks of 4 for each running prompt
    assert state.summary_us > 0
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=EngineState)
    assert wire == state


def test_engine_state_with_no_prefix_cache():
    pool = BlockPool(8)
    s = Scheduler(SchedulerConfig(2, 64), KVCacheManager(pool, NoPrefixCache(pool), 4), 64)
    state = engine_state(s, EngineStateQuery())
    assert state.cache_nodes == [] and state.num_cached_blocks == 0 and state.num_free_blocks == 8
