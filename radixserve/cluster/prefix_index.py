"""The API process's approximate picture of one replica's prefix cache.

The router cannot see a replica's radix tree (it lives in another process), so it keeps its
own record of what it sent there: the prompt's full blocks of ``block_size`` token ids, each
named by a chained hash (block k's hash covers blocks 0..k, so equal hashes mean equal
prefixes, up to hash collisions, which only cost a worse routing decision).

    prompt ids   [ b0 | b1 | b2 | b3 | partial ]      hashes h0 → h1 → h2 → h3  (partial: none)
    match        h0 ✓  h1 ✓  h2 ✗  → 2 blocks       (scan stops at the first miss)

Bounded: at most ``capacity`` hashes, least recently used evicted first. A sequence's blocks
are touched last-block-first, so its first blocks are the most recent and an old sequence
loses its tail before its head: the same leaf-first order as the engine's own LRU eviction,
which keeps what is left a prefix. The capacity defaults to the replica's KV blocks (what its
cache can hold at most), so the picture forgets at about the rate the replica does. It is an
estimate: the replica also evicts under memory pressure, which the router cannot see.
"""

from __future__ import annotations

from collections import OrderedDict


def block_hashes(token_ids: list[int], block_size: int, max_blocks: int) -> list[int]:
    """Chained hashes of the first ``max_blocks`` full blocks of ``token_ids``."""
    num_blocks = min(len(token_ids) // block_size, max_blocks)
    hashes, h = [], 0
    for i in range(num_blocks):
        h = hash((h, *token_ids[i * block_size:(i + 1) * block_size]))
        hashes.append(h)
    return hashes


class PrefixIndex:
    """One replica's block hashes, LRU-bounded. Not thread-safe: the API process's event
    loop is its only user."""

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` this replica was sent (no mutation)."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def insert(self, hashes: list[int]) -> None:
        """Record a prompt sent here: its blocks become the most recent (its first block
        most of all), then the least recent beyond ``capacity`` are dropped."""
        lru = self._lru
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def clear(self) -> None:
        """The replica's cache is gone (it died): forget everything."""
        self._lru.clear()
