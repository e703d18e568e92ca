"""The radix cache's eviction candidates: unlocked leaves, least recently used first.

A persistent lazy min-heap of ``(last_access, uid, node)`` entries. Nodes change under it
without telling it: an entry is dropped when found stale (its node died, grew children or got
locked) and pushed again with the fresh time when its node was touched since. The heap is
rebuilt when stale entries outnumber the nodes, so finding a victim costs O(log n), not a scan
of the tree.

NOTE: every unlocked leaf has at least one entry: the cache pushes a node whenever it becomes
an unlocked leaf (inserted, unlocked, or its last child removed).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from radixserve.core.kv.radix_node import RadixNode


class LeafHeap:
    """Not thread-safe: the cache's owner (the scheduler's thread) calls it."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, RadixNode]] = []

    def push_if_candidate(self, node: RadixNode, num_nodes: int,
                          nodes: Callable[[], Iterable[RadixNode]]) -> None:
        """Add ``node`` if it is an unlocked leaf. ``num_nodes``: the tree's size now;
        ``nodes``: all of them, read only when the heap is rebuilt."""
        if node.children or node.lock_ref:
            return
        heap = self._heap
        heapq.heappush(heap, (node.last_access, node.uid, node))
        if len(heap) > 2 * num_nodes + 64:  # mostly stale: rebuild in place
            heap[:] = [(x.last_access, x.uid, x) for x in nodes()
                       if not x.children and not x.lock_ref]
            heapq.heapify(heap)

    def least_recent(self) -> RadixNode | None:
        """The least recently used unlocked leaf (its entry stays until `pop`); None when
        there is none. Drops stale entries and re-files touched ones on the way."""
        heap = self._heap
        while heap:
            when, _, node = heap[0]
            if node.parent is None or node.children or node.lock_ref:
                heapq.heappop(heap)  # stale: dead, no longer a leaf, or locked
            elif when != node.last_access:
                heapq.heapreplace(heap, (node.last_access, node.uid, node))
            else:
                return node
        return None

    def pop(self) -> None:
        """Drop the entry `least_recent` returned (its node is being removed)."""
        heapq.heappop(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def uids(self) -> set[int]:
        """The nodes with an entry (stale ones too), for the integrity check."""
        return {entry[1] for entry in self._heap}
