"""KVCacheManager: what the scheduler talks to for KV blocks (match, allocate, free)."""

from __future__ import annotations

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.prefix_cache import PrefixCache
from radixserve.core.request import Request


class KVCacheManager:
    """Maps requests to block tables over a ``BlockPool``, reusing prefixes via a ``PrefixCache``.

    NOTE: a request's ``block_ids`` always cover at least its ``num_computed_tokens``; the
    prefix-cache handle of a running request stays locked until ``free``.
    """

    def __init__(self, block_pool: BlockPool, prefix_cache: PrefixCache, block_size: int) -> None:
        self.block_pool = block_pool
        self.prefix_cache = prefix_cache
        self.block_size = block_size
        self._handles: dict[str, object] = {}
        self.num_query_tokens = 0  # prefix-cache lookups, in tokens (metrics)
        self.num_hit_tokens = 0

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests (cached-but-unreferenced blocks count as free:
        they are evicted on demand)."""
        pool = self.block_pool
        used = pool.num_blocks - pool.num_free_blocks - self.prefix_cache.num_evictable_blocks
        return used / pool.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_and_lock(self, request: Request) -> int:
        """Attach the longest cached prefix to a request with no blocks; return its tokens.

        At least one token is always left to compute, so the request still samples.
        """
        assert not request.block_ids and request.num_computed_tokens == 0
        match = self.prefix_cache.match_prefix(request.all_token_ids[:-1])
        self.num_query_tokens += request.num_tokens
        self.num_hit_tokens += match.num_tokens
        self.prefix_cache.lock(match.handle)
        self._handles[request.request_id] = match.handle
        request.block_ids = list(match.block_ids)
        self.block_pool.share(request.block_ids)
        return match.num_tokens

    def can_fit(self, num_blocks: int) -> bool:
        """True if ``num_blocks`` more blocks can be had, evicting cached blocks if needed."""
        free = self.block_pool.num_free_blocks
        return free + self.prefix_cache.num_evictable_blocks >= num_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow ``request.block_ids`` to hold ``num_computed_tokens + num_new_tokens`` tokens.

        Evicts from the prefix cache when the pool is short. Returns False, changing nothing,
        if the blocks cannot be had.
        """
        total = request.num_computed_tokens + num_new_tokens
        need = self.num_blocks_for(total) - len(request.block_ids)
        if need <= 0:
            return True
        if not self.can_fit(need):
            return False
        short = need - self.block_pool.num_free_blocks
        if short > 0:
            self.prefix_cache.evict(short)
        request.block_ids.extend(self.block_pool.allocate(need))
        return True

    def trim(self, request: Request) -> None:
        """Return the blocks past the request's tokens (a rejected draft's lookahead slots;
        owned by the request alone: nothing indexes tokens that were never computed)."""
        keep = self.num_blocks_for(request.num_tokens)
        if len(request.block_ids) > keep:
            self.block_pool.free(request.block_ids[keep:])
            del request.block_ids[keep:]

    def cache_computed(self, request: Request) -> None:
        """Make the request's computed full pages findable by other requests now (after a
        prefill chunk, or when decoding fills a block), not only when it finishes."""
        computed = request.all_token_ids[: request.num_computed_tokens]
        handle = self.prefix_cache.cache_blocks(computed, request.block_ids)
        self.prefix_cache.lock(handle)
        self.prefix_cache.unlock(self._handles.get(request.request_id))
        self._handles[request.request_id] = handle

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (its computed prefix may stay cached)."""
        handle = self._handles.pop(request.request_id, None)
        computed = request.all_token_ids[: request.num_computed_tokens]
        self.prefix_cache.release(computed, request.block_ids, handle)
        request.block_ids = []

    def check_integrity(self) -> None:
        self.block_pool.check_integrity()
        self.prefix_cache.check_integrity()
