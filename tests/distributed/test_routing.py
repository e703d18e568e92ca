"""The data-parallel router alone: the prefix index's matching and leaf-first LRU eviction,
cache-aware routing with its load threshold, round robin and least load skipping dead
replicas, the CPU split and the summed stats."""

from __future__ import annotations

import pytest

from radixserve.cpu.split import replica_threads, split_cpus
from radixserve.cluster.dp_args import _cpu_ranges
from radixserve.cluster.dp_client import sum_stats
from radixserve.cluster.prefix_index import PrefixIndex, block_hashes
from radixserve.cluster.routing import (
    CacheAwareRouter, LeastLoadRouter, NoReplicaError, RoundRobinRouter, RoutingConfig,
    make_router)
from radixserve.core.reports import SchedulerStats

BS = 4


def _prompt(prefix: int, num_blocks: int, tail: list[int] = ()) -> list[int]:
    return [prefix * 1000 + i for i in range(num_blocks * BS)] + list(tail)


def test_block_hashes_chain_full_blocks_only_and_name_the_prefix():
    a = block_hashes(list(range(10)), BS, 100)
    assert len(a) == 2  # 10 tokens: two full blocks, the partial one is not hashed
    b = block_hashes(list(range(8)) + [99, 98, 97, 96], BS, 100)
    assert b[:2] == a and len(b) == 3
    # the same second block after a different first block is a different hash
    c = block_hashes([7, 7, 7, 7] + list(range(4, 8)), BS, 100)
    assert c[0] != a[0] and c[1] != a[1]
    assert block_hashes(list(range(40)), BS, 3) == block_hashes(list(range(12)), BS, 100)


def test_the_index_matches_leading_blocks_and_evicts_old_tails_first():
    index = PrefixIndex(capacity=6)
    a = block_hashes(_prompt(1, 4), BS, 100)
    b = block_hashes(_prompt(2, 4), BS, 100)
    index.insert(a)
    assert index.match(a) == 4 and index.match(b) == 0
    assert index.match(a[:2] + b[2:]) == 2
    index.insert(b)  # 8 blocks > 6: a's last two go, its head stays a prefix
    assert len(index) == 6
    assert index.match(a) == 2 and index.match(b) == 4
    index.insert(a[:1])  # a's head is the newest now; a's second block the oldest
    index.insert(block_hashes(_prompt(3, 2), BS, 100))  # two more: a's 2nd, b's 4th go
    assert index.match(a) == 1 and index.match(b) == 3
    index.clear()
    assert len(index) == 0 and index.match(a) == 0


def test_cache_aware_sends_a_prefix_back_where_it_went_and_new_ones_to_the_least_busy():
    router = CacheAwareRouter(BS, [100, 100], balance_threshold=4)
    assert router.choose(_prompt(1, 8), [0, 0]) == 0  # no match: least load, lowest index
    assert router.choose(_prompt(2, 8), [1, 0]) == 1  # no match: least load
    assert router.choose(_prompt(1, 8, [5, 6]), [1, 1]) == 0
    assert router.choose(_prompt(2, 8, [7]), [3, 1]) == 1
    assert router.choose(_prompt(1, 2), [4, 0]) == 0  # a partial match is still a match
    assert router.num_matched_tokens == (8 + 8 + 2) * BS
    assert router.num_routed == [3, 2]


def test_cache_aware_spreads_new_prefixes_over_idle_replicas_by_what_they_hold():
    router = CacheAwareRouter(BS, [100, 100], balance_threshold=4)
    assert [router.choose(_prompt(k, 8), [0, 0]) for k in range(4)] == [0, 1, 0, 1]
    assert router.choose(_prompt(9, 2), [0, 0]) == 0  # 16 blocks each: the lower index
    assert router.choose(_prompt(8, 4), [0, 0]) == 1  # replica 0 holds 2 more now


def test_cache_aware_gives_up_the_match_when_the_replica_is_too_busy():
    router = CacheAwareRouter(BS, [100, 100], balance_threshold=4)
    assert router.choose(_prompt(1, 8), [0, 0]) == 0
    assert router.choose(_prompt(1, 8), [4, 0]) == 0  # 4 busier: at the threshold, kept
    assert router.choose(_prompt(1, 8), [5, 0]) == 1  # 5 busier: lost to the idle one
    # replica 1 now holds the prefix too; the longer match still wins between the two
    assert router.choose(_prompt(1, 8), [1, 3]) == 0


def test_cache_aware_skips_a_dead_replica_and_forgets_what_a_restarted_one_held():
    router = CacheAwareRouter(BS, [100, 100], balance_threshold=4)
    assert router.choose(_prompt(1, 8), [0, 0]) == 0
    assert router.choose(_prompt(1, 8), [None, 3]) == 1
    router.forget(0)
    router.forget(1)
    assert router.choose(_prompt(1, 8), [2, 0]) == 1  # no match left: least load
    with pytest.raises(NoReplicaError):
        router.choose(_prompt(1, 8), [None, None])


def test_a_short_shared_preamble_does_not_pull_every_prompt_to_one_replica():
    router = CacheAwareRouter(BS, [100, 100], balance_threshold=4, cache_threshold=0.5)
    preamble = _prompt(0, 2)  # 2 blocks every prompt starts with
    prompts = [preamble + _prompt(k, 6) for k in (1, 2, 3, 4)]  # 8 blocks each
    assert [router.choose(p, [0, 0]) for p in prompts] == [0, 1, 0, 1]
    # a prompt sharing 4 of its 8 blocks (50 %) counts as a match
    assert router.choose(prompts[1][:4 * BS] + _prompt(9, 4), [0, 0]) == 1
    loose = CacheAwareRouter(BS, [100, 100], balance_threshold=4, cache_threshold=0.0)
    assert [loose.choose(p, [0, 0]) for p in prompts] == [0, 0, 0, 0]


def test_a_replica_without_a_kv_pool_gets_a_default_index_size():
    router = CacheAwareRouter(BS, [0, 0], balance_threshold=4)
    assert all(index.capacity > 1000 for index in router.indexes)


def test_round_robin_takes_turns_and_skips_dead_replicas():
    router = RoundRobinRouter(3)
    assert [router.choose([], [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert [router.choose([], [0, None, 0]) for _ in range(3)] == [2, 0, 2]
    with pytest.raises(NoReplicaError):
        router.choose([], [None, None, None])


def test_least_load_picks_the_fewest_in_flight():
    router = LeastLoadRouter(3)
    assert router.choose([], [3, 1, 2]) == 1
    assert router.choose([], [3, None, 2]) == 2
    assert router.choose([], [1, 1, 1]) == 0
    assert router.num_routed == [1, 1, 1]


def test_the_routing_config_names_what_is_supported():
    with pytest.raises(ValueError, match="cache_aware, round_robin, least_load"):
        RoutingConfig("random")
    with pytest.raises(ValueError, match="within"):
        RoutingConfig(cache_threshold=1.5)
    assert isinstance(make_router(RoutingConfig("least_load"), 16, [1, 1]), LeastLoadRouter)
    assert isinstance(make_router(RoutingConfig(), 16, [1, 1]), CacheAwareRouter)


def test_cpus_split_into_contiguous_runs_or_shared_when_too_few():
    assert split_cpus([0, 1, 2, 3, 4, 5, 6], 2) == [[0, 1, 2, 3], [4, 5, 6]]
    assert split_cpus([0, 1], 2) == [[0], [1]]
    assert split_cpus([4, 5], 3) == [[4], [5], [4]]
    assert _cpu_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert replica_threads(2, [0, 1, 2, 3], requested=7) == 7


def test_summed_stats_add_counts_and_weigh_kv_usage_by_blocks():
    s = sum_stats([SchedulerStats(2, 1, 0.5, 100, 40, 10, 1),
                   SchedulerStats(1, 0, 0.25, 300, 60, 30, 0)])
    assert (s.num_running, s.num_waiting, s.num_kv_blocks, s.prefix_query_tokens,
            s.prefix_hit_tokens, s.num_preemptions) == (3, 1, 400, 100, 40, 1)
    assert s.kv_usage == pytest.approx((50 + 75) / 400)


def test_summed_stats_add_the_speculative_counters():
    s = sum_stats([SchedulerStats(spec_num_drafts=3, spec_draft_tokens=9, spec_accepted_tokens=4,
                                  spec_accepted_per_pos=[2, 1, 1], spec_drafted_per_pos=[3, 3, 3]),
                   SchedulerStats(spec_num_drafts=2, spec_draft_tokens=3, spec_accepted_tokens=1,
                                  spec_accepted_per_pos=[1], spec_drafted_per_pos=[2, 1]),
                   SchedulerStats()])
    assert (s.spec_num_drafts, s.spec_draft_tokens, s.spec_accepted_tokens) == (5, 12, 5)
    assert (s.spec_accepted_per_pos, s.spec_drafted_per_pos) == ([3, 1, 1], [5, 4, 3])
