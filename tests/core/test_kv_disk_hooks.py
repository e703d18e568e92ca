"""The prefix cache's disk-tier hooks (core/kv/disk_hooks.py) with a fake tier: evicted pages
are offered before their blocks are freed, a match continues with the pages the tier holds,
which enter the tree as cached, and every block is accounted for."""

from __future__ import annotations

from radix_paths import path_tokens

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.sampling_params import SamplingParams

BS = 2


class FakeTier:
    """Keeps pages by their whole prefix (what a chained hash names); ``pool`` stands for the
    KV rows: block -> the prefix whose page it holds."""

    def __init__(self, pool: dict[int, tuple[int, ...]]) -> None:
        self.pool = pool
        self.disk: set[tuple[int, ...]] = set()
        self.evicted: list[tuple[tuple[int, ...], int]] = []
        self.bad: set[tuple[int, ...]] = set()

    def evicting(self, node, block_ids):
        tokens = path_tokens(node)
        first = len(tokens) // BS - len(block_ids)
        for i, b in enumerate(block_ids):
            prefix = tuple(tokens[:(first + i + 1) * BS])
            assert self.pool[b] == prefix, "a block's rows are gone before it was saved"
            self.evicted.append((prefix, b))
            self.disk.add(prefix)

    def lookup(self, token_ids, first_page):
        found = []
        for page in range(first_page, len(token_ids) // BS):
            prefix = tuple(token_ids[:(page + 1) * BS])
            if prefix not in self.disk:
                break
            found.append(prefix)
        return found

    def load(self, pages, block_ids):
        n = 0
        for prefix, b in zip(pages, block_ids):
            if prefix in self.bad:
                break
            self.pool[b] = prefix
            n += 1
        return n

    def close(self, cache):
        pass


def setup(num_blocks=6):
    pool = BlockPool(num_blocks)
    rows: dict[int, tuple[int, ...]] = {}
    tier = FakeTier(rows)
    cache = RadixCache(pool, BS, disk=tier)
    return KVCacheManager(pool, cache, BS, disk=tier), tier, rows


def run(kv, rows, rid, tokens):
    """Schedule ``tokens`` as a prompt, 'compute' it (the rows of each new page), finish."""
    request = Request(rid, list(tokens), SamplingParams(max_tokens=1), frozenset(), 0, 0.0)
    cached = kv.match_and_lock(request)
    request.num_computed_tokens = cached
    assert kv.allocate_slots(request, len(tokens) - cached)
    for page in range(cached // BS, len(tokens) // BS):
        rows[request.block_ids[page]] = tuple(tokens[:(page + 1) * BS])
    request.num_computed_tokens = len(tokens)
    kv.free(request)
    kv.check_integrity()
    return cached


def test_evicted_pages_are_saved_then_restored():
    kv, tier, rows = setup()
    a = [1, 2, 3, 4, 5, 6, 7]  # 3 full pages
    assert run(kv, rows, "a1", a) == 0
    assert kv.prefix_cache.num_cached_blocks == 3
    assert run(kv, rows, "b", [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11]) == 0  # 6 blocks: all of a's
    assert [p for p, _ in tier.evicted] == [(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]
    assert run(kv, rows, "a2", a) == 6  # every full page before the last token, from disk
    assert kv.num_disk_hit_tokens == 6
    assert kv.prefix_cache.cached_len(a) == 6  # and in the tree now


def test_a_match_continues_on_disk_after_the_tree():
    kv, tier, rows = setup(num_blocks=8)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # 4 pages
    run(kv, rows, "a1", a)
    kv.prefix_cache.evict(2)  # the leaf's last two pages
    assert [p for p, _ in tier.evicted] == [(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 7, 8)]
    assert run(kv, rows, "a2", a) == 8
    assert kv.num_disk_hit_tokens == 4


def test_a_bad_page_ends_the_restore_and_its_blocks_go_back():
    kv, tier, rows = setup(num_blocks=8)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    run(kv, rows, "a1", a)
    kv.prefix_cache.evict(4)
    tier.bad.add((1, 2, 3, 4, 5, 6))
    assert run(kv, rows, "a2", a) == 4  # pages 0-1 restored, 2 on computed
    assert kv.block_pool.num_free_blocks + kv.prefix_cache.num_cached_blocks == 8


def test_a_full_pool_restores_what_fits():
    kv, _, rows = setup(num_blocks=8)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    run(kv, rows, "a1", a)
    kv.prefix_cache.evict(4)
    other = Request("x", list(range(20, 33)), SamplingParams(max_tokens=1), frozenset(), 0, 0.0)
    kv.match_and_lock(other)
    assert kv.allocate_slots(other, 13)  # holds 7 of the 8 blocks
    request = Request("a2", a, SamplingParams(max_tokens=1), frozenset(), 0, 0.0)
    assert kv.match_and_lock(request) == 2  # one block left: one page back
    kv.check_integrity()
