"""A hybrid model's recurrent-state snapshots in the disk tier (core/kv/disk_hooks.py) with a
fake tier: a snapshot the cache lets go of is offered with its slot still holding the state at
its node's end; a match resumes at the deepest page whose state the disk holds, over the pages
the tree kept and those the disk holds; a state or page that fails to load changes nothing;
every block and slot is accounted for."""

from __future__ import annotations

from radix_paths import path_tokens

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_snapshots import Snapshots
from radixserve.core.kv.recurrent_states import ZERO, RecurrentStates
from radixserve.core.kv.state_pool import StatePool
from radixserve.core.request import Request
from radixserve.sampling_params import SamplingParams

BS = 2


class FakeTier:
    """Pages and states by the prefix they follow. ``rows``: block -> the prefix whose page
    it holds; ``slots``: state slot -> the prefix whose state it holds (the runner's)."""

    def __init__(self, rows: dict, slots: dict) -> None:
        self.rows, self.slots = rows, slots
        self.pages: set[tuple[int, ...]] = set()
        self.states: set[tuple[int, ...]] = set()
        self.bad: set[tuple[int, ...]] = set()

    def evicting(self, node, block_ids):
        tokens = path_tokens(node)
        first = len(tokens) // BS - len(block_ids)
        for i, b in enumerate(block_ids):
            prefix = tuple(tokens[:(first + i + 1) * BS])
            assert self.rows[b] == prefix
            self.pages.add(prefix)

    def evicting_state(self, node, slot):
        prefix = tuple(path_tokens(node))
        assert len(prefix) % BS == 0 and self.slots[slot] == prefix, "not the node's state"
        self.states.add(prefix)

    def lookup(self, token_ids, first_page):
        found = []
        for page in range(first_page, len(token_ids) // BS):
            prefix = tuple(token_ids[:(page + 1) * BS])
            if prefix not in self.pages:
                break
            found.append(prefix)
        return found

    def lookup_state(self, token_ids, lo, hi):
        for k in range(hi, lo, -1):
            if tuple(token_ids[:k * BS]) in self.states:
                return k, tuple(token_ids[:k * BS])
        return None

    def load(self, pages, block_ids):
        n = 0
        for prefix, b in zip(pages, block_ids):
            if prefix in self.bad:
                break
            self.rows[b] = prefix
            n += 1
        return n

    def load_state(self, prefix, slot):
        if prefix in self.bad:
            return False
        self.slots[slot] = prefix
        return True

    def close(self, cache):
        pass


def setup(num_blocks=16, num_slots=4):
    rows, slots = {}, {}
    tier = FakeTier(rows, slots)
    pool, states = BlockPool(num_blocks), StatePool(num_slots)
    cache = RadixCache(pool, BS, snapshots=Snapshots(states, tier), disk=tier)
    kv = KVCacheManager(pool, cache, BS, states=RecurrentStates(states, cache, BS, True),
                        disk=tier)
    return kv, tier


def run(kv, tier, rid, tokens):
    """Schedule ``tokens`` as one prefill chunk, 'compute' it (pages and states, checking the
    state it starts from), finish; return the tokens the match found cached."""
    request = Request(rid, list(tokens), SamplingParams(max_tokens=1), frozenset(), 0, 0.0)
    cached = kv.match_and_lock(request)
    request.num_computed_tokens = cached
    assert kv.allocate_slots(request, len(tokens) - cached)
    plan = kv.state_plan(request, len(tokens) - cached)
    start = () if plan.init == ZERO else tier.slots[plan.init]
    assert start == tuple(tokens[:cached]), "resumed from another prefix's state"
    for page in range(cached // BS, len(tokens) // BS):
        tier.rows[request.block_ids[page]] = tuple(tokens[:(page + 1) * BS])
    if plan.snapshot is not None:
        n, dst = plan.snapshot
        tier.slots[dst] = tuple(tokens[:cached + n])
    tier.slots[plan.slot] = tuple(tokens)
    request.num_computed_tokens = len(tokens)
    kv.cache_computed(request)
    kv.free(request)
    kv.check_integrity()
    return cached


A = [1, 2, 3, 4, 5, 6, 7]  # 3 full pages; the chunk's snapshot after 6 tokens


def crowd_out_states(kv, tier, n=4):
    """Other prompts whose snapshots push A's out of the state pool."""
    for i in range(n):
        run(kv, tier, f"x{i}", [50 + i, 60 + i, 70 + i])


def test_a_state_pushed_out_of_the_pool_comes_back_over_the_trees_pages():
    kv, tier = setup()
    assert run(kv, tier, "a1", A) == 0
    crowd_out_states(kv, tier)
    assert (1, 2, 3, 4, 5, 6) in tier.states and not tier.pages  # A's pages stayed
    assert kv.prefix_cache.cached_len(A[:-1]) == 0  # no snapshot left on its path
    assert run(kv, tier, "a2", A) == 6
    assert kv.num_disk_hit_tokens == 6


def test_pages_and_state_both_come_back_from_the_disk():
    kv, tier = setup(num_blocks=6)
    run(kv, tier, "a1", A)
    run(kv, tier, "b", [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11])  # A's pages and snapshot go
    assert (1, 2, 3, 4, 5, 6) in tier.states and len(tier.pages) >= 3
    assert run(kv, tier, "a2", A) == 6


def test_a_damaged_state_or_page_changes_nothing():
    for bad in [(1, 2, 3, 4, 5, 6), (1, 2, 3, 4)]:
        kv, tier = setup(num_blocks=6)
        run(kv, tier, "a1", A)
        run(kv, tier, "b", [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11])
        tier.bad.add(bad)
        assert run(kv, tier, "a2", A) == 0
        assert kv.block_pool.num_free_blocks + kv.prefix_cache.num_cached_blocks == 6


def test_a_state_is_not_taken_past_the_prompt_or_without_its_pages():
    kv, tier = setup(num_blocks=6)
    run(kv, tier, "a1", A)
    run(kv, tier, "b", [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11])
    tier.pages.discard((1, 2, 3, 4))  # page 1 gone: the pages stop before the state
    assert run(kv, tier, "a2", A) == 0
    assert run(kv, tier, "a3", A[:6]) == 0  # the state after 6 would leave no token
