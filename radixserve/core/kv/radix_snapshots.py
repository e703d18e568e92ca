"""Recurrent-state snapshots on the radix tree: what makes a prefix hit usable by a hybrid model.

Attention layers resume from any cached page, as their KV is per token. A recurrent layer
(Gated DeltaNet, Mamba) needs its state *at* the hit's end, and the state of a sequence exists
only where the runner copied it out: at page boundaries the KV manager picks (the end of each
prefill chunk's last full page, and of a request's last full page when it finishes; see
core/kv/recurrent_states.py). Those copies ("snapshots", state-pool slots) hang on the radix
node that ends at that page, so a match is cut back to the deepest node on its path that
holds one (SGLang's MambaRadixCache does the same with a state per node)::

    root - [sys prompt | turn 1 ...]* - [answer 1 ... ]* - [turn 2 ...]      * holds a snapshot
    a turn-3 prompt matches through "turn 2" but resumes after "answer 1", the deepest *

Memory: snapshots are slots of the one state pool, which live states need first: when the pool
runs dry, the least recently used snapshot goes (its node and KV stay, still a path to deeper
snapshots) — any but those *pinned*: a hit's snapshot until the step that copies it ran (a
request's own earlier chunk snapshots may go, though its lock keeps their pages); a node that
loses its KV (evicted, or its tail pages cut) frees its snapshot with it. A node split keeps its snapshot on the lower half, which keeps the
end the snapshot belongs to. A snapshot that goes is first offered to the disk tier
(``disk``: core/kv/disk_hooks.py), unless the whole cache is reset.

The null object, `NoSnapshots`, is the policy of a model without recurrent layers: a hit ends
wherever the pages match.
"""

from __future__ import annotations

from collections import OrderedDict

from radixserve.core.kv.disk_hooks import DiskTier, NoDiskTier
from radixserve.core.kv.radix_node import RadixNode
from radixserve.core.kv.state_pool import StatePool


class NoSnapshots:
    """Attention-only models: every matched page is usable."""

    count = 0
    keeps = False

    def hit(self, node: RadixNode, pos: int) -> tuple[RadixNode, int]:
        return node, pos

    def hit_len(self, node: RadixNode, pos: int) -> int:
        return pos

    def attach(self, node: RadixNode, slot: int) -> bool:
        return False

    def evict_one(self) -> bool:
        return False

    def pin(self, node: RadixNode) -> None:
        pass

    def unpin(self, node: RadixNode) -> None:
        pass

    def dropped(self, node: RadixNode) -> None:
        pass

    def clear(self) -> None:
        pass

    def check(self, nodes: list[RadixNode]) -> None:
        pass


class Snapshots:
    """Snapshots as state-pool slots on nodes (``node.snapshot``), least recently used first."""

    keeps = True

    def __init__(self, pool: StatePool, disk: DiskTier | None = None) -> None:
        self.pool = pool
        self.disk = disk or NoDiskTier()
        self._lru: OrderedDict[RadixNode, None] = OrderedDict()
        self._pins: dict[RadixNode, int] = {}

    @property
    def count(self) -> int:
        return len(self._lru)

    def hit(self, node: RadixNode, pos: int) -> tuple[RadixNode, int]:
        """The usable end of a match that ends at ``node`` (``node.end == pos``): the deepest
        node at or above it with a snapshot (the root, 0 tokens, if none); touches its LRU."""
        assert node.parent is None or node.end == pos
        while node.parent is not None and node.snapshot is None:
            node = node.parent
        if node.parent is None:
            return node, 0
        self._lru.move_to_end(node)
        return node, node.end

    def hit_len(self, node: RadixNode, pos: int) -> int:
        """`hit`'s length for a read-only descent that may stop inside ``node``."""
        if node.end != pos:
            node = node.parent
        while node is not None and node.parent is not None and node.snapshot is None:
            node = node.parent
        return 0 if node is None or node.parent is None else node.end

    def attach(self, node: RadixNode, slot: int) -> bool:
        """Hang the snapshot in ``slot`` (the state after ``node.end`` tokens) on ``node``;
        False (the caller keeps the slot) where the node has one already or is the root."""
        if node.parent is None or node.snapshot is not None:
            return False
        node.snapshot = slot
        self._lru[node] = None
        return True

    def evict_one(self) -> bool:
        """Free the least recently used snapshot not pinned; False if none."""
        for node in self._lru:
            if node not in self._pins:
                self._drop(node)
                return True
        return False

    def pin(self, node: RadixNode) -> None:
        """Keep ``node``'s snapshot until as many ``unpin`` (a hit about to copy it)."""
        self._pins[node] = self._pins.get(node, 0) + 1

    def unpin(self, node: RadixNode) -> None:
        left = self._pins.pop(node) - 1
        if left:
            self._pins[node] = left

    def dropped(self, node: RadixNode) -> None:
        """``node`` lost its end (removed, or its tail pages evicted): its snapshot goes."""
        if node.snapshot is not None:
            self._drop(node)

    def clear(self) -> None:
        for node in list(self._lru):
            self._drop(node, save=False)

    def check(self, nodes: list[RadixNode]) -> None:
        holders = [n for n in nodes if n.snapshot is not None]
        assert len(holders) == len(self._lru) and all(n in self._lru for n in holders), (
            f"{len(holders)} nodes hold snapshots, {len(self._lru)} are listed")

    def _drop(self, node: RadixNode, save: bool = True) -> None:
        """Free ``node``'s snapshot; ``save``: offer it to the disk tier first (its node
        still ends where the state belongs)."""
        del self._lru[node]
        if save:
            self.disk.evicting_state(node, node.snapshot)
        self.pool.free(node.snapshot)
        node.snapshot = None
