"""The top of a radix tree as a short list of plain records, for the engine view.

Breadth first from the root, so the shared prefixes (the upper levels) come before the
private tails: each visited node lists its ``max_children`` most used children (most hits,
then most blocks), down to ``max_depth`` levels, at most ``max_nodes`` nodes in all. Its cost
is bounded by the nodes listed and their children (choosing among a node's children is
O(children)), never the size of the whole tree. Read-only: no LRU touch, no hit counted.
"""

from __future__ import annotations

import heapq
from collections import deque

from radixserve.core.reports import CacheNodeInfo

HEAD_TOKENS = 16  # token ids of each node's key sent for a preview
MAX_CHILDREN = 6


def summarize(root, max_nodes: int, max_depth: int,
              max_children: int = MAX_CHILDREN) -> list[CacheNodeInfo]:
    """``root``: a `RadixCache` root node (``children``, ``key``, ``blocks``, ``hits``,
    ``lock_ref``). Parents precede their children in the result; ``parent`` is an index
    into it (-1 for the root's children)."""
    out: list[CacheNodeInfo] = []
    frontier = deque([(root, -1, 0)])
    while frontier and len(out) < max_nodes:
        node, index, depth = frontier.popleft()
        if depth >= max_depth or not node.children:
            continue
        room = max_nodes - len(out)
        shown = heapq.nlargest(min(max_children, room), node.children.values(),
                               key=lambda c: (c.hits, len(c.blocks)))
        if index >= 0:
            out[index].num_hidden_children = len(node.children) - len(shown)
        for child in shown:
            out.append(CacheNodeInfo(index, depth, len(child.key), len(child.blocks),
                                     child.hits, child.lock_ref, len(child.children),
                                     len(child.children), child.key[:HEAD_TOKENS],
                                     child.snapshot is not None))
            frontier.append((child, len(out) - 1, depth + 1))
    return out
