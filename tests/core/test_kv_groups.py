"""KV cache groups (core/kv/kv_groups.py): the groups of real layer patterns, exact block ids of
both groups through allocate / advance past the window / trim / free / preempt, the null
block, prefix-cache hits cut back to where the window is present, and random workloads that
never leak and keep a long sequence's sliding pages bounded."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroup, KVGroups
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams

# one full-attention layer, two sliding ones (window 8): units of one layer, 1 + 2 a page
TINY = KVGroups.from_windows([None, 8, 8])


def gemma3_windows(num_layers=18, window=512):
    return [None if (i + 1) % 6 == 0 else window for i in range(num_layers)]


def test_groups_of_real_layer_patterns():
    g = KVGroups.from_windows(gemma3_windows())  # Gemma 3 270M: 15 sliding, 3 global
    assert g.unit_layers == 3 and g.units_per_page == 6
    assert g.groups == (KVGroup((5, 11, 17), None, 1),
                        KVGroup((0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16), 512, 5))
    slots = g.layer_slots()
    assert slots[5] == (0, 0, 0) and slots[17] == (0, 0, 2)
    assert slots[0] == (1, 0, 0) and slots[6] == (1, 1, 2) and slots[16] == (1, 4, 2)
    # Gemma 3 1B: 26 layers, 4 global -> units of 2 layers, 2 + 11 a page
    g1 = KVGroups.from_windows(gemma3_windows(26))
    assert (g1.unit_layers, [x.units_per_page for x in g1.groups]) == (2, [2, 11])
    # Llama: one full group, a unit per layer as before; Mistral: one sliding group
    assert KVGroups.from_windows([None] * 4) == KVGroups.single(4)
    assert KVGroups.single(4).layer_slots() == [(0, 0, i) for i in range(4)]
    mistral = KVGroups.from_windows([8] * 4)
    assert mistral.groups == (KVGroup((0, 1, 2, 3), 8, 1),) and mistral.has_sliding
    assert "15 sliding (window 512)" in g.describe()


def test_units_held_and_longest_sequence():
    g = KVGroups.from_windows(gemma3_windows())
    # 8k tokens in blocks of 16, fed 512 a step: 512 global pages + 5 x 65 sliding ones
    assert g.units_held(8192, 16, 512) == 512 + 5 * 65
    assert g.units_held(100, 16, 512) == 7 * 6  # inside the window: every page
    assert g.max_tokens(512 + 5 * 65, 16, 512) == 8192
    assert KVGroups.single(4).max_tokens(10, 16, 512) == 160
    assert KVGroups.from_windows([8] * 2).max_tokens(10, 4, 4) == 1 << 40


def test_first_needed_page():
    group = KVGroup((0,), 8, 1)
    # a query at 10 reads keys 3..10: page 0 (0-3) still; at 11 (keys 4..11) no more
    assert [group.first_needed_page(p, 4) for p in (0, 7, 10, 11, 15, 16)] == [0, 0, 0, 1, 2, 2]
    assert KVGroup((0,), None, 1).first_needed_page(1000, 4) == 0


def test_null_block_is_reserved_last_and_never_free():
    pool = BlockPool(4, with_null_block=True)
    assert pool.null_block == 3 and list(pool.free_queue) == [0, 1, 2]
    assert pool.allocate(3) == [0, 1, 2] and pool.num_free_blocks == 0
    with pytest.raises(AssertionError):
        pool.free([3])
    pool.check_integrity()
    assert BlockPool(4).null_block is None


def make_request(rid, prompt, max_tokens=4):
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), frozenset(),
                   seed=0, max_tokens=max_tokens)


def advance(kv, request, num_new):
    """What a step does: allocate for ``num_new`` tokens, then mark them computed."""
    assert kv.allocate_slots(request, num_new)
    kv.check_request(request)
    kv.check_integrity()
    request.num_computed_tokens += num_new
    while request.num_tokens < request.num_computed_tokens + 1:
        request.append_token(7)


def test_block_ids_of_both_groups_through_a_window():
    pool = BlockPool(16, with_null_block=True)  # null block 15
    kv = KVCacheManager(pool, NoPrefixCache(pool), 4, TINY)
    r = make_request("a", range(10))
    advance(kv, r, 10)  # 3 pages: 1 unit each in the full group, 2 in the sliding one
    assert (r.block_ids, r.window_block_ids) == ([0, 1, 2], [[3, 4, 5, 6, 7, 8]])
    advance(kv, r, 1)  # the query at 10 still reads key 3 (page 0)
    assert r.window_block_ids == [[3, 4, 5, 6, 7, 8]]
    assert kv.allocate_slots(r, 1)  # at 11: page 0 is out of every later query's window
    assert r.window_block_ids == [[15, 15, 5, 6, 7, 8]]
    assert list(pool.free_queue) == [9, 10, 11, 12, 13, 14, 3, 4]
    r.num_computed_tokens += 1
    r.append_token(7)
    advance(kv, r, 1)  # at 12: a 4th page, in every group
    assert (r.block_ids, r.window_block_ids) == ([0, 1, 2, 9], [[15, 15, 5, 6, 7, 8, 10, 11]])
    for _ in range(3):  # at 15, page 1 goes
        advance(kv, r, 1)
    assert r.window_block_ids == [[15, 15, 15, 15, 7, 8, 10, 11]]
    assert list(pool.free_queue) == [12, 13, 14, 3, 4, 5, 6]
    advance(kv, r, 1)  # at 16: a 5th page
    assert (r.block_ids, r.window_block_ids) == ([0, 1, 2, 9, 12],
                                                 [[15, 15, 15, 15, 7, 8, 10, 11, 13, 14]])
    kv.free(r)  # the preempted or finished request: every table back, no null block
    assert (r.block_ids, r.window_block_ids) == ([], [])
    assert list(pool.free_queue) == [3, 4, 5, 6, 0, 1, 2, 9, 12, 7, 8, 10, 11, 13, 14]
    kv.check_integrity()


def test_trim_gives_back_lookahead_pages_of_every_group():
    pool = BlockPool(16, with_null_block=True)
    kv = KVCacheManager(pool, NoPrefixCache(pool), 4, TINY)
    r = make_request("a", range(7))
    advance(kv, r, 7)
    assert kv.allocate_slots(r, 1 + 5)  # a 5-token draft: positions 7..12, 4 pages
    assert (r.block_ids, r.window_block_ids) == ([0, 1, 6, 7], [[2, 3, 4, 5, 8, 9, 10, 11]])
    kv.trim(r)  # the draft was rejected: back to the 8 tokens (2 pages)
    assert (r.block_ids, r.window_block_ids) == ([0, 1], [[2, 3, 4, 5]])
    assert list(pool.free_queue) == [12, 13, 14, 6, 7, 8, 9, 10, 11]
    kv.check_request(r)
    kv.check_integrity()


def make_scheduler(num_blocks=64, block_size=4, budget=64, groups=TINY, cache=True,
                   max_num_seqs=8):
    pool = BlockPool(num_blocks, with_null_block=groups.has_sliding)
    prefix = RadixCache(pool, block_size, groups) if cache else NoPrefixCache(pool)
    kv = KVCacheManager(pool, prefix, block_size, groups)
    return Scheduler(SchedulerConfig(max_num_seqs, budget), kv, 512)


def step(s):
    out = s.schedule()
    sampled = [q.request_id for q in out.seqs if q.sample]
    none = [None] * len(sampled)
    s.update_from_output(out, ModelRunnerOutput(sampled, [7] * len(sampled), none, none))
    s.check_integrity()
    return out


def run_to_end(s):
    while s.num_unfinished:
        step(s)


def test_hit_is_cut_back_to_where_the_window_is_present():
    s = make_scheduler()
    prompt = list(range(100, 124))  # 6 pages
    s.add_request(make_request("a", prompt, max_tokens=12))
    run_to_end(s)
    cache = s.kv.prefix_cache
    # the prompt and more: the full path matches 6 pages (24 tokens), but page 5 was released
    # (out of window) and dropped; the hit falls back to 20 tokens, where the window is
    assert cache.cached_len(prompt + [1, 2, 3, 4]) == 20
    s.add_request(make_request("longer", prompt + [1, 2, 3, 4, 5]))
    out = step(s)
    assert [(q.request_id, q.start_pos) for q in out.seqs] == [("longer", 20)]
    null = s.kv.block_pool.null_block
    assert s.requests["longer"].window_block_ids[0][:6] == [null] * 6  # pages 0-2: not read
    run_to_end(s)
    # the same prompt again: its hit point (page 5: 20 tokens) kept its window (pages 3-4)
    s.add_request(make_request("same", prompt))
    out = step(s)
    assert [(q.request_id, q.start_pos) for q in out.seqs] == [("same", 20)]
    run_to_end(s)
    # the first request's whole conversation: its last window was kept when it finished
    turn = prompt + [7] * 12
    assert cache.cached_len(turn + [9]) == 32
    cache.evict(10**9)
    s.check_integrity()
    assert s.kv.block_pool.num_free_blocks == 63


def test_shared_prefix_keeps_its_window_at_the_branch():
    s = make_scheduler(num_blocks=96)
    stem = list(range(200, 220))  # 5 pages, then each request its own tail
    for i in range(3):
        s.add_request(make_request(f"r{i}", stem + [i] * 9, max_tokens=16))
    run_to_end(s)
    s.add_request(make_request("late", stem + [9] * 9))
    out = step(s)
    assert [(q.request_id, q.start_pos) for q in out.seqs] == [("late", 20)]
    run_to_end(s)


def test_long_sequence_holds_a_bounded_window():
    s = make_scheduler(num_blocks=96, budget=8)
    s.add_request(make_request("long", range(40), max_tokens=200))
    held = []
    null = s.kv.block_pool.null_block
    while s.num_unfinished:
        step(s)
        r = s.requests.get("long")
        if r is not None:
            held.append(sum(b != null for b in r.window_block_ids[0]))
    # a window of 8 tokens, fed at most 8 a step: at most 5 pages of 2 units each
    assert max(held) <= 10 and len(held) > 150
    s.kv.prefix_cache.evict(10**9)
    s.check_integrity()
    assert s.kv.block_pool.num_free_blocks == 95


@pytest.mark.parametrize("groups", [TINY, KVGroups.from_windows([8, 8]),
                                    KVGroups.from_windows(gemma3_windows(6, 8))])
@pytest.mark.parametrize("cache", [True, False])
def test_random_workload_with_aborts_never_leaks(groups, cache):
    rng = random.Random(0)
    s = make_scheduler(num_blocks=120, budget=12, groups=groups, cache=cache, max_num_seqs=4)
    stems = [[rng.randint(0, 50) for _ in range(rng.randint(4, 30))] for _ in range(4)]
    n = 0
    for _ in range(300):
        if rng.random() < 0.3:
            prompt = rng.choice(stems) + [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]
            s.add_request(make_request(f"r{n}", prompt, rng.randint(1, 24)))
            n += 1
        if rng.random() < 0.05 and s.requests:
            s.abort_requests([rng.choice(list(s.requests))])
        step(s)
    s.abort_requests(list(s.requests))
    prefix = s.kv.prefix_cache
    if cache:
        assert prefix.num_hit_tokens > 0 and prefix.num_protected_blocks == 0
    prefix.evict(10**9)
    s.check_integrity()
    assert s.kv.block_pool.num_free_blocks == 119


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20), st.integers(1, 20),
                          st.booleans()), min_size=1, max_size=12),
       st.integers(4, 16))
def test_property_no_leak_no_needed_page_released(requests, budget):
    """Any mix of requests (a stem, a tail, a length, aborted midway or not) over the
    windowed radix cache: integrity after every step (scheduler.check_integrity checks each
    running request's tables: every page its next queries read is present), and every
    block back in the pool at the end."""
    s = make_scheduler(num_blocks=90, budget=budget, max_num_seqs=3)
    stems = [[1] * 12, [1] * 6 + [2] * 6, [3] * 20, []]
    for i, (stem, tail, max_tokens, abort) in enumerate(requests):
        s.add_request(make_request(f"r{i}", stems[stem] + [i] * tail, max_tokens))
        step(s)
        if abort and s.requests:
            s.abort_requests([sorted(s.requests)[0]])
            s.check_integrity()
    run_to_end(s)
    s.kv.prefix_cache.evict(10**9)
    s.check_integrity()
    assert s.kv.block_pool.num_free_blocks == 89
