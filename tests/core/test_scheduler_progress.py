"""Prompt progress records from the scheduler (core/prompt_progress.py), pinned exactly with a
fake runner: one per prompt chunk of a request that asked, before its tokens, none otherwise."""

from __future__ import annotations

from test_scheduler import make_scheduler, step

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams


def _request(rid, prompt_len, max_tokens=2, progress=True, arrival=0.0, first=1):
    params = SamplingParams(max_tokens=max_tokens, return_progress=progress)
    return Request(rid, list(range(first, first + prompt_len)), params, frozenset(), seed=0,
                   arrival_time=arrival, max_tokens=max_tokens)


def _progress(results):
    """(request id, total, cache, processed) of each progress record, in order."""
    return [(r.request_id, r.prompt_progress.total, r.prompt_progress.cache,
             r.prompt_progress.processed) for r in results if r.prompt_progress is not None]


def test_each_prompt_chunk_reports_then_the_first_token_follows():
    s = make_scheduler(budget=10)
    s.add_request(_request("a", 25))
    _, results = step(s)
    assert _progress(results) == [("a", 25, 0, 10)]
    assert [(r.new_token_ids, r.finish_reason) for r in results] == [([], None)]
    _, results = step(s)
    assert _progress(results) == [("a", 25, 0, 20)]
    _, results = step(s)
    # the last chunk: its report first, then the token it sampled, in the same step
    assert _progress(results) == [("a", 25, 0, 25)]
    assert [r.new_token_ids for r in results] == [[], [7]]
    assert results[1].prompt_progress is None
    _, results = step(s)  # decoding: nothing more
    assert _progress(results) == [] and [r.new_token_ids for r in results] == [[7]]
    assert not s.num_unfinished


def test_only_requests_that_asked_get_reports():
    s = make_scheduler(budget=64)
    s.add_request(_request("quiet", 9, progress=False))
    s.add_request(_request("asks", 9, arrival=1.0))
    _, results = step(s)
    assert _progress(results) == [("asks", 9, 0, 9)]
    assert [(r.request_id, r.new_token_ids) for r in results] == [
        ("asks", []), ("quiet", [7]), ("asks", [7])]


def test_cached_prefix_is_counted_and_time_is_since_scheduling():
    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    s = Scheduler(SchedulerConfig(8, 8), kv, 256)
    s.add_request(_request("first", 18, max_tokens=1, progress=False))
    while s.num_unfinished:
        step(s)
    s.add_request(_request("again", 18, max_tokens=1))
    _, results = step(s)
    # 16 tokens (4 pages) come from the cache; the 2 left are one chunk
    assert _progress(results) == [("again", 18, 16, 18)]
    assert results[0].prompt_progress.time_ms >= 0


def test_preempted_after_its_first_token_reports_nothing_more():
    s = make_scheduler(num_blocks=6, block_size=4, budget=64)
    for i, rid in enumerate("abc"):
        s.add_request(_request(rid, 7, max_tokens=6, arrival=i))
    _, results = step(s)
    assert _progress(results) == [("a", 7, 0, 7), ("b", 7, 0, 7), ("c", 7, 0, 7)]
    reports, preempted = [], []
    while s.num_unfinished:
        out, results = step(s)
        reports += _progress(results)
        preempted += out.preempted_ids
    assert preempted == ["c"]
    assert reports == []  # c recomputed its prompt and output: not reported
