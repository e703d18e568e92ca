"""Recurrent-state slots and prefix-cache snapshots of hybrid models, pinned exactly with a
fake runner (no model): which slot each step zeroes, copies or snapshots, and what a later
request resumes from."""

from __future__ import annotations

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_snapshots import Snapshots
from radixserve.core.kv.recurrent_states import ZERO, RecurrentStates
from radixserve.core.kv.state_pool import StatePool
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams

BS = 4


def hybrid_scheduler(num_slots=8, budget=64, caching=True, max_num_seqs=8, num_blocks=64):
    pool = BlockPool(num_blocks)
    states = StatePool(num_slots)
    cache = (RadixCache(pool, BS, snapshots=Snapshots(states)) if caching
             else NoPrefixCache(pool))
    kv = KVCacheManager(pool, cache, BS, states=RecurrentStates(states, cache, BS, caching))
    return Scheduler(SchedulerConfig(max_num_seqs, budget), kv, 512)


def request(rid, tokens, max_tokens=3):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), frozenset(),
                   seed=0, max_tokens=max_tokens)


def step(s, token=7):
    out = s.schedule()
    sampled = [q.request_id for q in out.seqs if q.sample]
    s.update_from_output(out, ModelRunnerOutput(sampled, [token] * len(sampled),
                                                [None] * len(sampled), [None] * len(sampled)))
    s.check_integrity()
    return out


def run(s):
    steps = []
    while s.num_unfinished:
        steps.append(step(s))
    return steps


def test_state_pool_hands_out_each_slot_once():
    pool = StatePool(2)
    a, b = pool.allocate(), pool.allocate()
    assert {a, b} == {0, 1} and pool.allocate() is None
    pool.free(a)
    assert pool.allocate() == a


def test_fresh_request_zeroes_its_slot_then_continues_and_snapshots_page_ends():
    s = hybrid_scheduler(budget=6)
    s.add_request(request("a", range(1, 11)))  # 10 prompt tokens: chunks 6 + 4
    first = step(s).seqs[0]
    assert first.state.init == ZERO and first.state.snapshot == (4, first.state.snapshot[1])
    second = step(s).seqs[0]
    # chunk 6..10 crosses the page boundary at 8: the state after 2 of its tokens
    assert second.state.init is None and second.state.slot == first.state.slot
    assert second.state.snapshot[0] == 2
    decodes = run(s)
    # decode at positions 10, 11 (fills page 12: a copy after its one token), 12
    assert [q.seqs[0].state.snapshot is not None for q in decodes] == [False, True]


def test_a_second_turn_resumes_after_the_first_answer():
    s = hybrid_scheduler()
    turn1 = list(range(1, 15))  # 14 tokens, 3 generated: 17 tokens, pages end at 16
    s.add_request(request("t1", turn1))
    run(s)
    answer = [7, 7, 7]
    turn2 = turn1 + answer + [40, 41, 42, 43, 44]
    s.add_request(request("t2", turn2))
    out = step(s)
    (seq,) = out.seqs
    assert seq.start_pos == 16  # the answer's last full page, not the prompt's (12)
    assert seq.state.init not in (None, ZERO) and seq.state.init != seq.state.slot
    assert s.kv.num_hit_tokens == 16


def test_a_shared_prompt_hits_at_the_end_of_its_last_prefill_chunk():
    s = hybrid_scheduler(budget=8)
    s.add_request(request("a", range(1, 19), max_tokens=1))  # chunks 8, 8, 2
    run(s)
    s.add_request(request("b", list(range(1, 19)) + [99, 98], max_tokens=1))
    seq = step(s).seqs[0]
    # snapshots at 8 and 16 (each chunk's end) and, on finishing at 18 (+1 sampled), at 16
    assert seq.start_pos == 16 and seq.state.init not in (None, ZERO)


def test_no_hit_without_a_snapshot_even_where_pages_match():
    s = hybrid_scheduler()
    cache = s.kv.prefix_cache
    pool = s.kv.block_pool
    blocks = pool.allocate(3)
    node = cache.release(list(range(12)), blocks, None)  # 3 pages, no snapshot kept
    assert node.end == 12
    assert cache.match_prefix(list(range(13))).num_tokens == 0
    assert cache.cached_len(list(range(13))) == 0
    slot = s.kv.states.pool.allocate()
    assert cache.attach_snapshot(node, slot, 12)
    match = cache.match_prefix(list(range(13)))
    assert (match.num_tokens, match.snapshot) == (12, slot)
    assert cache.cached_len(list(range(13))) == 12
    # a split above the snapshot keeps it at its end (on the lower half)
    assert cache.match_prefix(list(range(8)) + [50, 51, 52, 53, 54]).num_tokens == 0
    assert cache.match_prefix(list(range(13))).num_tokens == 12
    cache.check_integrity()


def test_evicting_a_node_frees_its_snapshot_and_pinned_snapshots_stay():
    s = hybrid_scheduler(num_slots=3)
    cache, states = s.kv.prefix_cache, s.kv.states.pool
    node = cache.release(list(range(8)), s.kv.block_pool.allocate(2), None)
    assert cache.attach_snapshot(node, states.allocate(), 8)
    cache.pin_snapshot(node, True)  # a hit that has not copied it yet
    assert not cache.evict_snapshot()
    cache.pin_snapshot(node, False)
    assert cache.evict_snapshot() and states.num_free == 3
    assert cache.attach_snapshot(node, states.allocate(), 8)
    cache.evict(2)
    assert states.num_free == 3 and cache.snapshots.count == 0
    cache.check_integrity()


def test_requests_wait_for_a_free_live_slot():
    s = hybrid_scheduler(num_slots=2, caching=False)
    for i in range(3):
        s.add_request(request(f"r{i}", range(1, 5), max_tokens=2))
    out = step(s)
    assert [q.request_id for q in out.seqs] == ["r0", "r1"]
    assert {q.state.slot for q in out.seqs} == {0, 1}
    run(s)
    assert s.kv.states.num_held == 0 and s.kv.states.pool.num_free == 2


def test_preemption_keeps_a_snapshot_and_resumes_from_it():
    s = hybrid_scheduler(num_blocks=8, num_slots=8, budget=64)
    s.add_request(request("a", range(1, 13), max_tokens=20))  # needs 8 blocks at the end
    step(s)
    s.add_request(request("b", range(100, 104), max_tokens=1))
    s._preempt(s.running[0])  # as when the pool runs out
    out = step(s)
    seq = next(q for q in out.seqs if q.request_id == "a")
    assert seq.start_pos == 12 and seq.state.init not in (None, ZERO)
    run(s)
    assert s.kv.states.num_held == 0


def test_the_same_prompt_again_hits_even_when_it_fills_its_last_page():
    s = hybrid_scheduler()
    s.add_request(request("a", range(1, 17), max_tokens=1))  # 16 tokens: 4 full pages
    (seq,) = step(s).seqs
    assert seq.state.snapshot[0] == 12  # before the last token's page: a hit must leave one
    s.add_request(request("b", range(1, 17), max_tokens=1))
    (seq,) = step(s).seqs
    assert seq.start_pos == 12 and seq.state.init not in (None, ZERO)


def test_a_snapshot_inside_a_node_splits_it_there():
    s = hybrid_scheduler()
    cache = s.kv.prefix_cache
    node = cache.release(list(range(16)), s.kv.block_pool.allocate(4), None)
    slot = s.kv.states.pool.allocate()
    assert cache.attach_snapshot(node, slot, 8)
    match = cache.match_prefix(list(range(17)))
    assert (match.num_tokens, match.snapshot) == (8, slot)
    assert len(match.block_ids) == 2
    cache.check_integrity()


def test_a_rejected_draft_restarts_from_the_state_after_the_kept_tokens():
    pool = StatePool(6)
    states = RecurrentStates(pool, NoPrefixCache(BlockPool(4)), BS, snapshots=False)
    assert states.acquire("r", None)
    states.plan("r", 0, 5, 5)
    state = states.plan("r", 5, 1, 5)  # a decode step that carries 3 drafts
    assert states.add_draft("r", state, 3) and len(state.drafts) == 3
    states.draft_applied("r", 3, 1)  # kept the first draft: the state after 2 of 4 tokens
    assert states.plan("r", 7, 1, 5).init == state.drafts[1]
    states.draft_applied("r", 3, 3)  # all kept: the live state is right
    assert states.plan("r", 11, 1, 5).init is None
    assert not states.add_draft("r", state, 9)  # the pool has no room for 9: no draft
    states.release("r", None, 0, False)
    assert pool.num_free == 6


def test_a_full_pool_gives_up_its_oldest_snapshots_for_the_newest():
    """4 slots: a live and a boundary slot for the request, room for 2 snapshots; a prompt of
    five chunks snapshots each chunk's end, then its answer's end (its live state, which ends on a
    page boundary): the next turn resumes after
    the answer (the oldest snapshots went)."""
    s = hybrid_scheduler(num_slots=4, budget=8)
    prompt = list(range(1, 41))
    s.add_request(request("t1", prompt, max_tokens=6))
    run(s)
    assert s.kv.prefix_cache.snapshots.count == 3  # and the request's two slots: 1 back
    turn2 = prompt + [7] * 6 + [50, 51, 52]
    s.add_request(request("t2", turn2, max_tokens=1))
    seq = step(s).seqs[0]
    assert seq.start_pos == 44 and seq.state.init not in (None, ZERO)  # (40 + 6 - 1) // 4 * 4
