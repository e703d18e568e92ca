"""Scheduler decisions pinned exactly, with a fake runner (no model)."""

from __future__ import annotations

import random

import pytest

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, max_len=256):
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, NoPrefixCache(pool), block_size)
    return Scheduler(SchedulerConfig(max_num_seqs, budget), kv, max_len)


def make_request(rid, prompt_len, max_tokens=4, priority=0, arrival=0.0, eos=()):
    return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens),
                   frozenset(eos), seed=0, arrival_time=arrival, priority=priority,
                   max_tokens=max_tokens)


def fake_run(sched_out, token=7):
    """Every sampling sequence samples ``token``."""
    sampled = [s.request_id for s in sched_out.seqs if s.sample]
    return ModelRunnerOutput(sampled, [token] * len(sampled), [None] * len(sampled),
                             [None] * len(sampled))


def step(s, token=7):
    out = s.schedule()
    results = s.update_from_output(out, fake_run(out, token))
    s.check_integrity()
    return out, results


def test_budget_splits_long_prompt_into_chunks_and_decodes_go_first():
    s = make_scheduler(budget=10)
    s.add_request(make_request("a", 3, max_tokens=5, arrival=0))
    s.add_request(make_request("b", 25, max_tokens=2, arrival=1))
    out, _ = step(s)
    assert [(q.request_id, q.num_tokens, q.start_pos, q.sample) for q in out.seqs] == [
        ("a", 3, 0, True), ("b", 7, 0, False)]
    out, _ = step(s)
    # a decodes first (1 token), b gets the rest of the budget as its next chunk
    assert [(q.request_id, q.num_tokens, q.start_pos) for q in out.seqs] == [
        ("a", 1, 3), ("b", 9, 7)]
    out, _ = step(s)
    assert [(q.request_id, q.num_tokens, q.start_pos, q.sample) for q in out.seqs] == [
        ("a", 1, 4, True), ("b", 9, 16, True)]
    assert out.num_batched_tokens == 10


def test_max_num_seqs_caps_running():
    s = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(make_request(f"r{i}", 2, arrival=i))
    out, _ = step(s)
    assert [q.request_id for q in out.seqs] == ["r0", "r1"]
    assert [r.request_id for r in s.waiting] == ["r2"]


def test_requests_finish_by_length_and_stop_token_and_free_blocks():
    s = make_scheduler()
    s.add_request(make_request("len", 5, max_tokens=3))
    s.add_request(make_request("eos", 5, max_tokens=10, eos=(7,)))
    finished = {}
    while s.num_unfinished:
        _, results = step(s)
        for r in results:
            if r.finish_reason:
                finished[r.request_id] = r.finish_reason
    assert finished == {"eos": "stop", "len": "length"}
    assert s.kv.block_pool.num_free_blocks == 64


def test_priority_then_arrival_order():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("late-high", 2, priority=0, arrival=5))
    s.add_request(make_request("early-low", 2, priority=1, arrival=1))
    s.add_request(make_request("early-high", 2, priority=0, arrival=2))
    assert [r.request_id for r in s.waiting] == ["early-high", "late-high", "early-low"]


def test_preemption_picks_lowest_priority_latest_and_resumes():
    # 6 blocks of 4 tokens; three requests of 7 prompt tokens (2 blocks each) fill the pool.
    s = make_scheduler(num_blocks=6, block_size=4, budget=64)
    s.add_request(make_request("a", 7, max_tokens=6, priority=0, arrival=0))
    s.add_request(make_request("b", 7, max_tokens=6, priority=0, arrival=1))
    s.add_request(make_request("c", 7, max_tokens=6, priority=0, arrival=2))
    step(s)  # all prefilled (7 tokens = 2 blocks each), pool full
    step(s)  # 8th token still fits in 2 blocks
    assert s.kv.block_pool.num_free_blocks == 0
    out, _ = step(s)  # all need a 3rd block: c (latest arrival) is preempted, a and b go on
    assert out.preempted_ids == ["c"]
    assert [q.request_id for q in out.seqs] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]
    c = s.requests["c"]
    assert c.num_computed_tokens == 0 and c.block_ids == [] and c.num_output_tokens == 2
    while s.num_unfinished:
        step(s)
    assert s.kv.block_pool.num_free_blocks == 6


def test_abort_anywhere_frees_everything():
    s = make_scheduler(budget=4)
    s.add_request(make_request("run", 3, max_tokens=50))
    s.add_request(make_request("chunk", 20, max_tokens=50))
    s.add_request(make_request("wait", 3, max_tokens=50))
    step(s)
    step(s)
    s.abort_requests(["run", "chunk", "wait", "unknown"])
    assert s.num_unfinished == 0
    assert s.kv.block_pool.num_free_blocks == 64
    s.check_integrity()


def test_request_larger_than_pool_is_rejected():
    s = make_scheduler(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="KV blocks"):
        s.add_request(make_request("big", 20, max_tokens=4))


def test_random_workload_never_leaks():
    rng = random.Random(0)
    s = make_scheduler(num_blocks=24, block_size=4, budget=16, max_num_seqs=4)
    n = 0
    for _ in range(200):
        if rng.random() < 0.3:
            s.add_request(make_request(f"r{n}", rng.randint(1, 30), rng.randint(1, 12),
                                       rng.randint(0, 2), n))
            n += 1
        if rng.random() < 0.05 and s.requests:
            s.abort_requests([rng.choice(list(s.requests))])
        step(s, token=rng.randint(0, 9))
    s.abort_requests(list(s.requests))
    assert s.kv.block_pool.num_free_blocks == 24


def test_n_samples_wait_for_the_shared_prefill_then_hit_the_cache():
    from radixserve.core.kv.radix_cache import RadixCache

    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(8, 64), kv, 256)
    for i in range(3):
        s.add_request(make_request(f"p-{i}", 18, max_tokens=3, arrival=0))
    out, _ = step(s)
    assert [(q.request_id, q.num_tokens) for q in out.seqs] == [("p-0", 18)]
    out, _ = step(s)
    # the siblings reuse the 16 cached prompt tokens (4 pages) and compute 2 each
    assert [(q.request_id, q.start_pos, q.num_tokens) for q in out.seqs] == [
        ("p-0", 18, 1), ("p-1", 16, 2), ("p-2", 16, 2)]
    assert s.requests["p-1"].num_cached_tokens == 16
    while s.num_unfinished:
        step(s)
    kv.prefix_cache.evict(64)
    assert pool.num_free_blocks == 64


def test_lpm_orders_waiting_by_cached_prefix_within_priority():
    from radixserve.core.kv.radix_cache import RadixCache

    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(1, 64, policy="lpm"), kv, 256)
    warm = make_request("warm", 12, max_tokens=1)
    s.add_request(warm)
    while s.num_unfinished:
        step(s)  # tokens 1..12 are now cached (2 pages of 4 + the rest)
    cold = Request("cold", [50, 51, 52, 53, 54, 55], SamplingParams(), frozenset(), 0, 1.0)
    hot = Request("hot", list(range(1, 13)) + [99], SamplingParams(), frozenset(), 0, 2.0)
    urgent = Request("urgent", [60, 61], SamplingParams(), frozenset(), 0, 3.0, priority=-1)
    for r in (cold, hot, urgent):
        s.add_request(r)
    out, _ = step(s)
    assert [q.request_id for q in out.seqs] == ["urgent"]  # priority beats cache
    assert [r.request_id for r in s.waiting] == ["hot", "cold"]  # then longest match


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="lpm"):
        SchedulerConfig(policy="random")


def test_requests_sharing_a_first_page_wait_for_its_prefill():
    from radixserve.core.kv.radix_cache import RadixCache

    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(8, 64), kv, 256)
    system = list(range(1, 13))  # a 12-token shared "system prompt"
    s.add_request(Request("a", system + [20, 21], SamplingParams(), frozenset(), 0, 0.0))
    s.add_request(Request("b", system + [30, 31, 32], SamplingParams(), frozenset(), 0, 1.0))
    s.add_request(Request("other", [90] * 9, SamplingParams(), frozenset(), 0, 2.0))
    out, _ = step(s)
    assert [q.request_id for q in out.seqs] == ["a", "other"]  # b waits for a's pages
    out, _ = step(s)
    b = next(q for q in out.seqs if q.request_id == "b")
    assert (b.start_pos, b.num_tokens) == (12, 3)  # the system prompt came from the cache


def test_requests_sharing_a_cached_prefix_start_together():
    """Once the shared pages are cached, requests that differ after them are admitted in the
    same step (each computes only its own pages), not one per step."""
    from radixserve.core.kv.radix_cache import RadixCache

    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(8, 64), kv, 256)
    system = list(range(1, 14))  # 13 tokens: three full pages and one token of a fourth
    s.add_request(Request("first", system + [20, 21], SamplingParams(), frozenset(), 0, 0.0))
    step(s)
    for i in range(3):
        s.add_request(Request(f"r{i}", system + [30 + i] * 6, SamplingParams(), frozenset(), 0,
                              1.0 + i))
    out, _ = step(s)
    starts = {q.request_id: (q.start_pos, q.num_tokens) for q in out.seqs}
    assert starts == {"first": (15, 1), "r0": (12, 7), "r1": (12, 7), "r2": (12, 7)}


def test_no_prefix_cache_does_not_defer():
    s = make_scheduler()
    s.add_request(make_request("a", 18, arrival=0))
    s.add_request(make_request("b", 18, arrival=1))
    out, _ = step(s)
    assert [q.request_id for q in out.seqs] == ["a", "b"]
