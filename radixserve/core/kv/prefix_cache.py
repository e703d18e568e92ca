"""PrefixCache: the interface the KV manager uses to reuse KV of earlier requests.

Implementations: ``NoPrefixCache`` (no reuse) and the radix-tree cache. Token runs are
page-aligned: only whole blocks of ``block_size`` tokens are ever cached or matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class PrefixMatch:
    """``block_ids`` hold the KV of the first ``num_tokens`` tokens; ``handle`` is what to lock.
    ``window_block_ids``: the tables of the KV groups after the first (kv_groups.py), the
    pages a sliding group no longer needs holding the null block. ``snapshot``: for a hybrid
    model, the state-pool slot holding its recurrent state after ``num_tokens`` (None with no
    hit; core/kv/radix_snapshots.py). ``past_block_ids``: the first group's blocks of the
    pages the tree matched past a hybrid's usable hit (no snapshot at their ends), neither
    locked nor shared: a recurrent state from the disk tier may make them usable."""

    block_ids: list[int]
    num_tokens: int
    handle: Any = None
    window_block_ids: list[list[int]] = field(default_factory=list)
    snapshot: int | None = None  # the recurrent-state slot to resume from (hybrid models)
    past_block_ids: list[int] = field(default_factory=list)


class PrefixCache(Protocol):
    reuses_prefixes: bool  # False for the null cache: nothing is gained by waiting for a prefix
    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``token_ids``. Touches LRU state only.

        The match must be ``lock``ed before its blocks are used, or they may be evicted.
        """

    def cached_len(self, token_ids: list[int]) -> int:
        """The ``num_tokens`` a ``match_prefix`` would return now, with no side effect (for
        scheduling decisions; not counted as a query)."""

    def lock(self, handle: Any) -> None:
        """Protect the matched path from eviction (ref count +1)."""

    def unlock(self, handle: Any) -> None:
        """Undo one ``lock``."""

    def release(self, token_ids: list[int], block_ids: list[int], handle: Any,
                window_block_ids: list[list[int]] = ()) -> Any:
        """A request is done with ``block_ids`` (and its other groups' ``window_block_ids``)
        holding KV for ``token_ids``.

        Unlocks ``handle``; keeps what is worth caching; returns the rest to the block pool
        (never the null block). Returns the handle of its last full page (None: not cached).
        """

    def attach_snapshot(self, handle: Any, slot: int, end: int) -> bool:
        """Keep state-pool ``slot`` (a hybrid model's recurrent state after ``end`` tokens of
        ``handle``'s path, page-aligned) for later hits; False when not taken (the caller
        keeps it)."""

    def evict_snapshot(self) -> bool:
        """Free one kept snapshot (least recently used, not pinned); False if none."""

    def pin_snapshot(self, handle: Any, pinned: bool) -> None:
        """Keep (``pinned``) or release the snapshot at ``handle`` that a hit copies."""

    def cache_blocks(self, token_ids: list[int], block_ids: list[int],
                     window_block_ids: list[list[int]] = ()) -> Any:
        """Index the full pages of a running request's computed ``token_ids`` (held in
        ``block_ids`` and ``window_block_ids``) without releasing anything; return the new
        handle to lock (the caller locks it and unlocks the old one)."""

    def forget(self, handle: Any, group: int, lo: int, released: list[int],
               keep_end: int = 0) -> None:
        """The request holding ``handle`` released the pages from ``lo`` on of sliding group
        ``group`` (out of its window; ``released``: their block ids, ``units_per_page`` a
        page); the cache may drop its references to those same blocks too, but should keep
        the window before page ``keep_end`` (where the request's own prompt would hit)."""

    def evict(self, num_blocks: int) -> int:
        """Free unreferenced cached blocks, LRU first, until ``num_blocks`` are freed or none
        is left; return how many (with several KV groups a page's units go together, so it
        may be a few more than asked)."""

    def reset(self) -> bool:
        """Drop every cached page, unless a request locks some (then change nothing); return
        whether it did. Reported to the KV events sink as ``cleared``."""

    @property
    def num_evictable_blocks(self) -> int: ...

    @property
    def num_cached_blocks(self) -> int:
        """Blocks the cache holds a reference to (evictable or locked by a request)."""

    @property
    def num_nodes(self) -> int: ...

    def summary(self, max_nodes: int, max_depth: int) -> list:
        """At most ``max_nodes`` `CacheNodeInfo`s of the top ``max_depth`` levels, parents
        first; read-only (no LRU touch, no hit counted). Its cost is bounded by the nodes it
        lists and their children, never the whole cache."""

    def check_integrity(self) -> None: ...
