"""RadixCache: exact behaviour, a stateful property test against the block pool, and the cache
driven by the real KVCacheManager + Scheduler with a fake runner."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams


def make_cache(num_blocks=16, block_size=2):
    pool = BlockPool(num_blocks)
    return pool, RadixCache(pool, block_size)


def start(cache, pool, tokens):
    """What the KV manager does for a new request: match, lock, share, allocate the rest."""
    m = cache.match_prefix(tokens)
    cache.lock(m.handle)
    pool.share(m.block_ids)
    need = -(-len(tokens) // cache.block_size) - len(m.block_ids)
    return m, m.block_ids + pool.allocate(need)


def serve(cache, pool, tokens):
    """One request from match to release; returns its block table."""
    m, blocks = start(cache, pool, tokens)
    cache.release(tokens, blocks, m.handle)
    cache.check_integrity()
    pool.check_integrity()
    return blocks


def shape(node, bs=2):
    """The tree under ``node`` as nested ``{first page: (key, blocks, children)}``."""
    return {page: (c.key, c.blocks, shape(c, bs)) for page, c in node.children.items()}


# -- exact behaviour --------------------------------------------------------------------------


def test_match_on_empty_tree():
    _, cache = make_cache()
    m = cache.match_prefix([1, 2, 3, 4])
    assert (m.block_ids, m.num_tokens, m.handle) == ([], 0, cache.root)
    cache.lock(m.handle)
    cache.unlock(m.handle)
    assert (cache.num_queries_tokens, cache.num_hit_tokens) == (4, 0)
    assert cache.num_cached_blocks == 0 and cache.evict(10) == 0
    cache.check_integrity()


def test_insert_then_match_full_and_partial():
    pool, cache = make_cache()
    assert serve(cache, pool, [1, 2, 3, 4, 5, 6]) == [0, 1, 2]
    assert pool.ref_counts[:4] == [1, 1, 1, 0]  # the tree's reference only
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert (m.block_ids, m.num_tokens) == ([0, 1, 2], 6)
    m = cache.match_prefix([1, 2, 3, 4, 5])  # ends inside the node: split after 2 pages
    assert (m.block_ids, m.num_tokens) == ([0, 1], 4)
    assert m.handle.key == [1, 2, 3, 4] and m.handle.blocks == [0, 1]
    assert shape(cache.root) == {(1, 2): ([1, 2, 3, 4], [0, 1], {(5, 6): ([5, 6], [2], {})})}
    assert cache.match_prefix([1, 2, 9]).block_ids == [0]
    assert cache.match_prefix([1, 9, 3, 4]).num_tokens == 0
    assert (cache.num_queries_tokens, cache.num_hit_tokens) == (6 + 7 + 5 + 3 + 4, 6 + 4 + 2)
    cache.check_integrity()


def test_second_sequence_diverging_mid_node_splits_at_page_boundary():
    pool, cache = make_cache()
    serve(cache, pool, [1, 2, 3, 4, 5, 6])  # blocks 0 1 2
    m, blocks = start(cache, pool, [1, 2, 3, 4, 9, 9, 7])
    assert (m.block_ids, m.num_tokens, blocks) == ([0, 1], 4, [0, 1, 3, 4])
    assert m.handle.lock_ref == 1 and cache.num_protected_blocks == 2
    cache.release([1, 2, 3, 4, 9, 9, 7], blocks, m.handle)
    assert shape(cache.root) == {(1, 2): ([1, 2, 3, 4], [0, 1], {
        (5, 6): ([5, 6], [2], {}),
        (9, 9): ([9, 9], [3], {})})}
    assert pool.ref_counts[:5] == [1, 1, 1, 1, 0]  # block 4 held only the tail token 7
    assert cache.match_prefix([1, 2, 3, 4, 9, 9, 7]).block_ids == [0, 1, 3]
    assert (cache.num_cached_blocks, cache.num_evictable_blocks) == (4, 4)
    cache.check_integrity()


def test_non_page_aligned_tail_is_not_cached():
    pool, cache = make_cache(block_size=4)
    serve(cache, pool, [1, 2, 3, 4, 5, 6, 7])  # blocks 0 (full page) and 1 (3 tokens)
    assert cache.num_cached_blocks == 1 and pool.ref_counts[:2] == [1, 0]
    assert list(pool.free_queue)[-1] == 1
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert (m.block_ids, m.num_tokens) == ([0], 4)
    serve(cache, pool, [1, 2, 3])  # shorter than a page: nothing to cache
    assert cache.num_cached_blocks == 1
    cache.check_integrity()


def test_lock_prevents_eviction_until_unlocked():
    pool, cache = make_cache()
    serve(cache, pool, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.handle)
    assert (cache.num_evictable_blocks, cache.num_protected_blocks) == (0, 2)
    assert cache.evict(10) == 0 and cache.num_cached_blocks == 2
    cache.lock(m.handle)
    cache.unlock(m.handle)
    assert cache.evict(10) == 0
    cache.unlock(m.handle)
    assert (cache.num_evictable_blocks, cache.num_protected_blocks) == (2, 0)
    assert cache.evict(10) == 2 and pool.num_free_blocks == 16
    cache.check_integrity()


def test_splitting_a_locked_node_keeps_the_lock_on_both_halves():
    pool, cache = make_cache()
    serve(cache, pool, [1, 2, 3, 4, 5, 6])
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.lock(m.handle)
    upper = cache.match_prefix([1, 2, 3, 4, 9, 9]).handle  # splits the locked node
    assert (upper.lock_ref, m.handle.lock_ref, m.handle.parent) == (1, 1, upper)
    assert (cache.num_protected_blocks, cache.evict(10)) == (3, 0)
    cache.check_integrity()
    cache.unlock(m.handle)
    assert (upper.lock_ref, cache.num_evictable_blocks) == (0, 3)
    assert cache.evict(10) == 3
    cache.check_integrity()


def test_eviction_is_lru_and_takes_tail_pages_first():
    pool, cache = make_cache()
    serve(cache, pool, [1, 1, 2, 2])  # blocks 0 1
    serve(cache, pool, [3, 3, 4, 4])  # blocks 2 3
    cache.match_prefix([1, 1, 2, 2])  # now [3 3 4 4] is the least recently used
    assert cache.evict(1) == 1 and pool.ref_counts[:4] == [1, 1, 1, 0]  # its tail page
    m = cache.match_prefix([3, 3, 4, 4])  # and [1 1 2 2] is the older
    assert (m.block_ids, m.num_tokens) == ([2], 2)
    assert cache.evict(1) == 1 and pool.ref_counts[:4] == [1, 0, 1, 0]
    assert cache.evict(2) == 2 and pool.ref_counts[:4] == [0, 0, 0, 0]
    assert list(pool.free_queue)[-4:] == [3, 1, 0, 2]  # trimmed leaf kept its old time
    cache.check_integrity()


def test_split_stamps_only_the_matched_half():
    pool, cache = make_cache()
    serve(cache, pool, [1, 1, 2, 2])  # blocks 0 1
    serve(cache, pool, [3, 3])  # block 2
    cache.match_prefix([1, 1, 9, 9])  # split: [1 1] is touched, its unmatched [2 2] is not
    assert cache.evict(1) == 1 and pool.ref_counts[:3] == [1, 0, 1]
    assert cache.evict(1) == 1 and pool.ref_counts[:3] == [1, 0, 0]
    cache.check_integrity()


def test_parent_becoming_a_leaf_is_evicted_in_cascade():
    pool, cache = make_cache()
    serve(cache, pool, [1, 2, 3, 4])  # blocks 0 1
    serve(cache, pool, [1, 2, 5, 6])  # hits [1 2] -> block 0; block 2 for [5 6]
    assert shape(cache.root) == {(1, 2): ([1, 2], [0], {
        (3, 4): ([3, 4], [1], {}), (5, 6): ([5, 6], [2], {})})}
    assert cache.evict(2) == 2 and shape(cache.root) == {(1, 2): ([1, 2], [0], {})}
    assert list(pool.free_queue)[-2:] == [1, 2]
    assert cache.evict(5) == 1 and cache.num_cached_blocks == 0
    assert list(pool.free_queue)[-1] == 0 and pool.num_free_blocks == 16
    cache.check_integrity()


def test_two_requests_inserting_the_same_prefix_free_the_duplicate():
    pool, cache = make_cache()
    a_match, a = start(cache, pool, [1, 2, 3, 4, 5])
    b_match, b = start(cache, pool, [1, 2, 3, 4, 5])  # both missed: private copies
    assert (a, b) == ([0, 1, 2], [3, 4, 5])
    cache.release([1, 2, 3, 4, 5], a, a_match.handle)
    cache.release([1, 2, 3, 4, 5], b, b_match.handle)
    assert pool.ref_counts[:6] == [1, 1, 0, 0, 0, 0]
    assert cache.match_prefix([1, 2, 3, 4, 5]).block_ids == [0, 1]
    assert cache.evict(100) == 2 and pool.num_free_blocks == 16
    cache.check_integrity()


def test_cache_blocks_of_a_running_request_and_handle_swap():
    pool, cache = make_cache()
    serve(cache, pool, [1, 2, 3, 4])  # 0 1
    m, blocks = start(cache, pool, [1, 2, 3, 4, 5, 6, 7])
    assert blocks == [0, 1, 2, 3]
    handle = cache.cache_blocks([1, 2, 3, 4, 5, 6], blocks)  # prompt computed, 7 pending
    assert handle.key == [5, 6] and handle.blocks == [2] and pool.ref_counts[2] == 2
    cache.lock(handle)
    cache.unlock(m.handle)
    assert (cache.num_protected_blocks, cache.num_evictable_blocks) == (3, 0)
    other = cache.match_prefix([1, 2, 3, 4, 5, 6, 8])  # a second turn hits the running one
    assert other.block_ids == [0, 1, 2]
    cache.release([1, 2, 3, 4, 5, 6, 7, 8], blocks, handle)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).block_ids == [0, 1, 2, 3]
    assert cache.num_cached_blocks == 4 and pool.num_free_blocks == 12
    cache.check_integrity()
    assert cache.evict(100) == 4 and pool.num_free_blocks == 16


def test_bad_block_size():
    with pytest.raises(ValueError):
        RadixCache(BlockPool(4), 0)


# -- stateful property test -------------------------------------------------------------------

POOL, BS = 24, 2
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=14)


class RadixMachine(RuleBasedStateMachine):
    """Requests over a 3-token alphabet: match -> lock -> share -> grow -> release, with
    evictions and mid-flight ``cache_blocks`` in between; references are counted exactly."""

    def __init__(self):
        super().__init__()
        self.pool = BlockPool(POOL)
        self.cache = RadixCache(self.pool, BS)
        self.live: list[dict] = []  # tokens (all computed), blocks, handle

    def _grab(self, need):
        """allocate_slots' rule: evict when short; None if the blocks cannot be had."""
        if self.pool.num_free_blocks + self.cache.num_evictable_blocks < need:
            return None
        short = need - self.pool.num_free_blocks
        if short > 0:
            assert self.cache.evict(short) == short
        return self.pool.allocate(need)

    @rule(tokens=tokens_st)
    def start(self, tokens):
        stats = (self.cache.num_queries_tokens, self.cache.num_hit_tokens)
        peek = self.cache.cached_len(tokens)  # read only: no stats, no split
        assert (self.cache.num_queries_tokens, self.cache.num_hit_tokens) == stats
        self.cache.check_integrity()
        m = self.cache.match_prefix(tokens)
        assert m.num_tokens == peek
        assert m.num_tokens % BS == 0 and len(m.block_ids) == m.num_tokens // BS
        self.cache.lock(m.handle)
        self.pool.share(m.block_ids)
        req = {"tokens": tokens[:m.num_tokens], "blocks": list(m.block_ids), "handle": m.handle}
        self.live.append(req)
        self._grow(req, tokens[m.num_tokens:])

    def _grow(self, req, more):
        need = -(-(len(req["tokens"]) + len(more)) // BS) - len(req["blocks"])
        got = self._grab(max(need, 0))
        if got is not None:
            req["blocks"] += got
            req["tokens"] += more

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), more=tokens_st)
    def grow(self, i, more):
        self._grow(self.live[i % len(self.live)], more)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def cache_running(self, i):
        req = self.live[i % len(self.live)]
        handle = self.cache.cache_blocks(req["tokens"], req["blocks"])
        self.cache.lock(handle)
        self.cache.unlock(req["handle"])
        req["handle"] = handle

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), cut=st.integers(0, 100))
    def release(self, i, cut):
        req = self.live.pop(i % len(self.live))
        tokens = req["tokens"][:len(req["tokens"]) - cut % (len(req["tokens"]) + 1)]
        self.cache.release(tokens, req["blocks"], req["handle"])  # abort keeps a prefix

    @rule(n=st.integers(0, POOL))
    def evict(self, n):
        free = self.pool.num_free_blocks
        evictable = self.cache.num_evictable_blocks
        freed = self.cache.evict(n)
        assert freed == min(n, evictable) == self.pool.num_free_blocks - free

    @invariant()
    def integrity(self):
        self.cache.check_integrity()
        self.pool.check_integrity()
        held = self.cache.num_cached_blocks + sum(len(r["blocks"]) for r in self.live)
        assert sum(self.pool.ref_counts) == held, "a reference leaked"

    def teardown(self):
        for req in self.live:
            self.cache.release(req["tokens"], req["blocks"], req["handle"])
        self.cache.check_integrity()
        assert self.cache.num_protected_blocks == 0
        self.cache.evict(10**9)
        assert self.pool.num_free_blocks == POOL and self.cache.num_cached_blocks == 0
        self.pool.check_integrity()


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
TestRadixMachine = RadixMachine.TestCase


# -- with the KV manager and the scheduler ----------------------------------------------------


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, max_len=256):
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, RadixCache(pool, block_size), block_size)
    return Scheduler(SchedulerConfig(max_num_seqs, budget), kv, max_len)


def make_request(rid, prompt, max_tokens=2, arrival=0.0, priority=0):
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), frozenset(),
                   seed=0, arrival_time=arrival, priority=priority, max_tokens=max_tokens)


def step(s):
    """One engine step with a fake runner: every sampling sequence samples token 7."""
    out = s.schedule()
    sampled = [q.request_id for q in out.seqs if q.sample]
    none = [None] * len(sampled)
    s.update_from_output(out, ModelRunnerOutput(sampled, [7] * len(sampled), none, none))
    s.check_integrity()
    return out


def run_to_end(s):
    while s.num_unfinished:
        step(s)


def test_same_long_prompt_hits_page_aligned_prefix():
    s = make_scheduler()
    prompt = list(range(100, 130))  # 30 tokens: 7 full pages
    s.add_request(make_request("a", prompt))
    run_to_end(s)
    s.add_request(make_request("b", prompt))
    out = step(s)
    assert [(q.request_id, q.start_pos, q.num_tokens) for q in out.seqs] == [("b", 28, 2)]
    assert s.requests["b"].num_cached_tokens == 28
    run_to_end(s)
    cache = s.kv.prefix_cache
    assert cache.num_hit_tokens == 28 and cache.num_protected_blocks == 0
    assert cache.num_cached_blocks == 7 and cache.evict(10**9) == 7
    assert s.kv.block_pool.num_free_blocks == 64


def test_random_workload_with_aborts_never_leaks():
    rng = random.Random(0)
    # 20 blocks for up to 4 requests of up to 12: the cache evicts and requests get preempted
    s = make_scheduler(num_blocks=20, block_size=4, budget=16, max_num_seqs=4)
    stems = [[rng.randint(0, 50) for _ in range(rng.randint(4, 24))] for _ in range(4)]
    n = 0
    for _ in range(400):
        if rng.random() < 0.3:
            prompt = rng.choice(stems) + [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]
            s.add_request(make_request(f"r{n}", prompt, rng.randint(1, 12), n, rng.randint(0, 2)))
            n += 1
        if rng.random() < 0.05 and s.requests:
            s.abort_requests([rng.choice(list(s.requests))])
        step(s)
    s.abort_requests(list(s.requests))
    cache = s.kv.prefix_cache
    assert cache.num_hit_tokens > 0 and cache.num_protected_blocks == 0
    cache.evict(10**9)
    s.check_integrity()
    assert s.kv.block_pool.num_free_blocks == 20
