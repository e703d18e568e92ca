"""KV events from the radix cache: exact records for store, split, evict and reset, with
vLLM's block hashes (recomputed here from the formula, not from radixserve's helpers)."""

from __future__ import annotations

import hashlib
import pickle

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                          KVEventLog, NoKVEvents)
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_node import iter_nodes

SEED = "0"


def vllm_hashes(token_ids: list[int], block_size: int, seed: str = SEED) -> list[int]:
    """vLLM's chained block hashes of every full page (sha256 over pickle, NONE_HASH from
    PYTHONHASHSEED, low 64 bits big-endian on the wire)."""
    def h(obj):
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    parent, out = h(seed), []
    for i in range(0, len(token_ids) - len(token_ids) % block_size, block_size):
        parent = h((parent, tuple(token_ids[i:i + block_size]), None))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


def make(num_blocks=16, block_size=2):
    pool = BlockPool(num_blocks)
    log = KVEventLog(block_size, SEED)
    return pool, RadixCache(pool, block_size, events=log), log


def serve(cache, pool, tokens):
    m = cache.match_prefix(tokens)
    cache.lock(m.handle)
    pool.share(m.block_ids)
    need = -(-len(tokens) // cache.block_size) - len(m.block_ids)
    if need > pool.num_free_blocks:  # as KVCacheManager.allocate_slots does
        cache.evict(need - pool.num_free_blocks)
    blocks = m.block_ids + pool.allocate(need)
    cache.release(tokens, blocks, m.handle)
    cache.check_integrity()


def test_hash_known_value():
    """Pinned: page [1, 2] of block size 2 starting a sequence, PYTHONHASHSEED=0."""
    assert vllm_hashes([1, 2], 2) == [12262773037183220419]
    log = KVEventLog(2, SEED)
    log.stored(None, [1, 2])
    assert log.take() == [BlockStored([12262773037183220419], None, [1, 2], 2)]


def test_stored_chains_and_shares_prefix():
    pool, cache, log = make()
    serve(cache, pool, [1, 2, 3, 4, 5])  # the tail 5 is not a full page: not stored
    h = vllm_hashes([1, 2, 3, 4, 9, 9], 2)
    assert log.take() == [BlockStored(h[:2], None, [1, 2, 3, 4], 2)]
    serve(cache, pool, [1, 2, 3, 4, 9, 9])  # shares two pages: only the third is new
    assert log.take() == [BlockStored(h[2:], h[1], [9, 9], 2)]
    serve(cache, pool, [1, 2, 3, 4])  # all cached: nothing
    assert log.take() == []


def test_split_keeps_chain_for_children():
    pool, cache, log = make()
    serve(cache, pool, [1, 2, 3, 4, 5, 6])
    log.take()
    serve(cache, pool, [1, 2, 7, 8])  # splits [1 2|3 4|5 6] after one page
    h = vllm_hashes([1, 2, 7, 8], 2)
    assert log.take() == [BlockStored(h[1:], h[0], [7, 8], 2)]


def test_evict_reports_removed_pages_lru_first():
    pool, cache, log = make(num_blocks=4)
    serve(cache, pool, [1, 2, 3, 4])
    serve(cache, pool, [5, 6, 7, 8])
    log.take()
    assert cache.evict(1) == 1  # the older leaf gives up its tail page
    assert log.take() == [BlockRemoved(vllm_hashes([1, 2, 3, 4], 2)[1:])]
    assert cache.evict(2) == 2  # then its last page, then the other leaf's tail
    assert log.take() == [BlockRemoved(vllm_hashes([1, 2], 2)),
                          BlockRemoved(vllm_hashes([5, 6, 7, 8], 2)[1:])]
    cache.check_integrity()


def test_evicted_prefix_stored_again_with_same_hashes():
    pool, cache, log = make(num_blocks=2)
    serve(cache, pool, [1, 2, 3, 4])
    serve(cache, pool, [5, 6, 7, 8])  # evicts [1 2 3 4] to fit
    h = vllm_hashes([1, 2, 3, 4], 2)
    assert log.take() == [BlockStored(h, None, [1, 2, 3, 4], 2), BlockRemoved(h),
                          BlockStored(vllm_hashes([5, 6, 7, 8], 2), None, [5, 6, 7, 8], 2)]
    serve(cache, pool, [1, 2, 3, 4])
    assert log.take()[-1] == BlockStored(h, None, [1, 2, 3, 4], 2)


def test_reset_clears_unless_locked():
    pool, cache, log = make()
    serve(cache, pool, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.lock(m.handle)
    assert not cache.reset()
    cache.unlock(m.handle)
    log.take()
    assert cache.reset()
    assert log.take() == [AllBlocksCleared()]
    assert cache.num_cached_blocks == 0 and pool.num_free_blocks == 16
    cache.check_integrity()
    serve(cache, pool, [1, 2])
    assert log.take() == [BlockStored(vllm_hashes([1, 2], 2), None, [1, 2], 2)]


def test_null_sink_keeps_no_hashes():
    pool = BlockPool(8)
    cache = RadixCache(pool, 2)
    assert isinstance(cache.events, NoKVEvents)
    serve(cache, pool, [1, 2, 3, 4])
    assert all(not node.hashes for node in iter_nodes(cache.root))
