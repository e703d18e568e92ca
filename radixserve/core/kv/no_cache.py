"""NoPrefixCache: the null PrefixCache: nothing is cached, released blocks go back to the pool."""

from __future__ import annotations

from typing import Any

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.prefix_cache import PrefixMatch


class NoPrefixCache:
    reuses_prefixes = False
    def __init__(self, block_pool: BlockPool) -> None:
        self.block_pool = block_pool

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        return PrefixMatch([], 0)

    def cached_len(self, token_ids: list[int]) -> int:
        return 0

    def lock(self, handle: Any) -> None:
        pass

    def unlock(self, handle: Any) -> None:
        pass

    def release(self, token_ids: list[int], block_ids: list[int], handle: Any) -> None:
        self.block_pool.free(block_ids)

    def cache_blocks(self, token_ids: list[int], block_ids: list[int]) -> Any:
        return None

    def evict(self, num_blocks: int) -> int:
        return 0

    @property
    def num_evictable_blocks(self) -> int:
        return 0

    @property
    def num_cached_blocks(self) -> int:
        return 0

    @property
    def num_nodes(self) -> int:
        return 0

    def summary(self, max_nodes: int, max_depth: int) -> list:
        return []

    def check_integrity(self) -> None:
        pass
