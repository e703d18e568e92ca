"""The disk tier's per-node page keys (kvdisk/tier.py `NodeKeys`) stay equal to hashing each
node's whole path while the radix tree splits nodes and evicts their tails."""

from __future__ import annotations

import random

from radix_paths import path_tokens

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_events import chain_hashes
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_node import iter_nodes
from radixserve.kvdisk.tier import ROOT_HASH, NodeKeys

BS = 2


def expected(node) -> list[bytes]:
    return chain_hashes(ROOT_HASH, path_tokens(node), BS)[-(len(node.key) // BS):]


class CheckingTier:
    """Checks the keys of every eviction, as the tier computes them."""

    def __init__(self) -> None:
        self.keys = NodeKeys(BS)
        self.num_checked = 0

    def evicting(self, node, block_ids):
        got = self.keys.of(node)[-len(block_ids):]
        assert got == expected(node)[-len(block_ids):]
        self.num_checked += len(block_ids)
        if len(block_ids) * BS == len(node.key):
            self.keys.forget(node)

    def lookup(self, token_ids, first_page):
        return []

    def load(self, pages, block_ids):
        return 0

    def close(self, cache):
        pass


def test_keys_follow_splits_and_tail_evictions():
    rng = random.Random(5)
    pool = BlockPool(40)
    tier = CheckingTier()
    cache = RadixCache(pool, BS, disk=tier)
    for _ in range(300):
        if rng.random() < 0.6:  # a sequence sharing a random prefix with a cached one
            base = [rng.randrange(4) for _ in range(rng.randrange(2, 16))]
            pages = len(base) // BS
            if pool.num_free_blocks < pages:
                cache.evict(pages - pool.num_free_blocks)
            cache.release(base, pool.allocate(pages), None)
        else:
            cache.evict(rng.randrange(1, 4))
        for node in iter_nodes(cache.root):
            if rng.random() < 0.3:
                assert tier.keys.of(node) == expected(node)
        cache.check_integrity()
    assert tier.num_checked > 100
