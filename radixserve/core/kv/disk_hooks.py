"""The prefix cache's disk tier, as the core sees it (the engine implements it: kvdisk/tier.py).

Pages leave the pool when the radix cache evicts them; their KV rows stay intact in the pool
until a later forward writes those blocks, which cannot happen before the scheduler hands the
blocks out again and the step runs. So the cache calls `DiskTier.evicting` *before* it frees
the blocks, and the tier copies the rows out then and there (the write to disk may come later).
On a request's radix miss the KV manager asks `DiskTier.lookup` how many of the next pages the
disk holds, gives them blocks and has `DiskTier.load` copy their rows in before the step's
forward; the pages then enter the tree as cached.

A hybrid model's hit must end where its recurrent state is known (core/kv/radix_snapshots.py).
A snapshot the cache lets go of (the state pool's LRU, or its node's pages evicted) is offered
to `DiskTier.evicting_state` before its slot is freed. On a match the KV manager asks
`DiskTier.lookup_state` for the deepest page end, past the tree's usable hit and within the
pages the tree and the disk hold, whose state the disk has; `DiskTier.load_state` copies it
into a slot, which then serves as the tree's own snapshot there.

`NoDiskTier` is the null object (the tier is off): nothing is hashed, copied or looked up.
"""

from __future__ import annotations

from typing import Any, Protocol

from radixserve.core.kv.radix_node import RadixNode


class DiskTier(Protocol):
    """Called on the scheduler's thread, between steps (no forward is running)."""

    def evicting(self, node: RadixNode, block_ids: list[int]) -> None:
        """The cache is about to free ``block_ids``: the last ``len(block_ids)`` pages of
        ``node`` (whose path from the root spells their prefix). Copy out what the disk
        does not hold yet, now: the blocks may be reused as soon as this returns."""

    def evicting_state(self, node: RadixNode, slot: int) -> None:
        """The cache is about to free state slot ``slot``: the recurrent state after
        ``node.end`` tokens (a page boundary), ``node`` still in place. Copy it out now."""

    def lookup(self, token_ids: list[int], first_page: int) -> list[Any]:
        """The pages of ``token_ids`` (cache keys, kv_manager.cache_tokens) from
        ``first_page`` on that the disk holds, in order, up to the first it does not; opaque
        handles for `load`. Nothing is read yet."""

    def lookup_state(self, token_ids: list[int], lo: int, hi: int) -> tuple[int, Any] | None:
        """The deepest page count ``k`` in ``lo < k <= hi`` for which the disk holds the
        state after ``token_ids[:k * block_size]``, and an opaque handle for `load_state`;
        None if none."""

    def load_state(self, handle: Any, slot: int) -> bool:
        """Copy the state of ``handle`` (from `lookup_state`) into ``slot``; False (the slot
        untouched or partly written) when its file turns out damaged or gone."""

    def load(self, pages: list[Any], block_ids: list[int]) -> int:
        """Copy the rows of ``pages`` (from `lookup`) into ``block_ids`` (as many, allocated
        to the caller); return how many were loaded: a page whose file turns out damaged or
        gone ends the run there (the blocks after it are untouched)."""

    def close(self, cache: Any) -> None:
        """The engine stops: save what ``cache`` (the prefix cache) holds that the disk does
        not (pages and snapshots), within the budget, and wait for the writes."""


class NoDiskTier:
    """The null tier: no page is saved or found."""

    def evicting(self, node: RadixNode, block_ids: list[int]) -> None:
        pass

    def evicting_state(self, node: RadixNode, slot: int) -> None:
        pass

    def lookup(self, token_ids: list[int], first_page: int) -> list[Any]:
        return []

    def lookup_state(self, token_ids: list[int], lo: int, hi: int) -> tuple[int, Any] | None:
        return None

    def load(self, pages: list[Any], block_ids: list[int]) -> int:
        return 0

    def load_state(self, handle: Any, slot: int) -> bool:
        return False

    def close(self, cache: Any) -> None:
        pass
