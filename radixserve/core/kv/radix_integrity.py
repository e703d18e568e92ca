"""The radix tree's invariants, checked by a walk of the whole tree (tests call it after
every step through `RadixCache.check_integrity`; too slow for the serving path)."""

from __future__ import annotations

from typing import NamedTuple

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroup
from radixserve.core.kv.radix_node import RadixNode, iter_nodes


class TreeCounts(NamedTuple):
    """What the cache's incremental counters must equal."""

    num_nodes: int  # excluding the root
    num_evictable: int  # pool references held by unlocked nodes
    num_protected: int  # pool references held by locked nodes


def check_tree(root: RadixNode, groups: tuple[KVGroup, ...], block_size: int,
               block_pool: BlockPool, candidates: set[int]) -> TreeCounts:
    """Assert every node's invariants; return the counts a walk finds. Read-only.

    Per node: filed under its first page, key a whole number of pages, ``end`` and ``hashes``
    consistent with the key, every group's table as long as the key's pages, no ancestor
    locked less, no block twice in the tree nor free in the pool, the null block only in a
    sliding group, ``units`` the ids held, an unlocked leaf's uid among ``candidates`` (the
    eviction heap's entries).
    """
    bs, ref_counts, null = block_size, block_pool.ref_counts, block_pool.null_block
    seen: set[int] = set()
    evictable = protected = num_nodes = 0
    for node in iter_nodes(root):
        num_nodes += 1
        parent = node.parent
        assert parent is not None and parent.children.get(tuple(node.key[:bs])) is node
        assert node.lock_ref >= 0, f"negative lock_ref {node.lock_ref}"
        assert node.key and len(node.key) % bs == 0, f"key of {len(node.key)} tokens"
        assert parent is root or parent.lock_ref >= node.lock_ref, "ancestor unlocked"
        assert node.end == parent.end + len(node.key), "node end off its key"
        assert not node.hashes or len(node.hashes) * bs == len(node.key), "hashes off pages"
        units = 0
        for group, table in zip(groups, node.tables, strict=True):
            pages = len(table) // group.units_per_page
            assert pages * bs == len(node.key), "a table does not match the key's pages"
            for b in table:
                if b == null:
                    assert group.is_sliding, "the null block in a full-attention table"
                    continue
                assert b not in seen, f"block {b} twice in the tree"
                assert ref_counts[b] >= 1, f"cached block {b} is free in the pool"
                seen.add(b)
                units += 1
        assert units == node.units, f"node holds {units} blocks, counted {node.units}"
        if node.lock_ref:
            protected += units
        else:
            evictable += units
            assert node.children or node.uid in candidates, "unlocked leaf not in the heap"
    return TreeCounts(num_nodes, evictable, protected)
