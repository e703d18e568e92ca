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

    def release(self, token_ids: list[int], block_ids: list[int], handle: Any,
                window_block_ids: list[list[int]] = ()) -> None:
        null = self.block_pool.null_block
        for table in (block_ids, *window_block_ids):
            self.block_pool.free([b for b in table if b != null] if null is not None else table)

    def attach_snapshot(self, handle: Any, slot: int, end: int) -> bool:
        return False

    def evict_snapshot(self) -> bool:
        return False

    def pin_snapshot(self, handle: Any, pinned: bool) -> None:
        pass

    def cache_blocks(self, token_ids: list[int], block_ids: list[int],
                     window_block_ids: list[list[int]] = ()) -> Any:
        return None

    def forget(self, handle: Any, group: int, lo: int, released: list[int],
               keep_end: int = 0) -> None:
        pass

    def evict(self, num_blocks: int) -> int:
        return 0

    def reset(self) -> bool:
        return True  # nothing cached

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
