"""The radix tree's node record and the read-only ways down it (radix_cache.py owns the tree).

A node's ``key`` is a whole number of pages (``block_size`` tokens) and its parent files it
under its first page. Nothing here mutates a node: matching, splitting and inserting are the
cache's, which also keeps the counters these records feed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class RadixNode:
    """``len(key) == len(blocks) / units_per_page * block_size`` (one id a page with one
    group). ``parent`` is None for the root and dead nodes."""

    key: list[int]
    blocks: list[int]
    parent: RadixNode | None
    last_access: int
    uid: int
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    hits: int = 0  # prefix matches that used this node (for the engine view)
    window_blocks: list[list[int]] = field(default_factory=list)  # the other groups' tables
    units: int = 0  # pool references held (the ids that are not the null block)
    end: int = 0  # tokens from the root to the end of ``key``
    hashes: list[bytes] = field(default_factory=list)  # one per page with KV events, else []
    snapshot: int | None = None  # a recurrent-state slot: the state after ``end`` tokens

    @property
    def tables(self) -> list[list[int]]:
        return [self.blocks, *self.window_blocks]


def match_child(node: RadixNode, token_ids: list[int], pos: int, n: int,
                block_size: int) -> tuple[RadixNode | None, int]:
    """The child of ``node`` that continues ``token_ids[pos:n]``, and how many of its
    tokens match: its whole key, or the whole pages it shares (0 when no child)."""
    child = node.children.get(tuple(token_ids[pos:pos + block_size]))
    if child is None:
        return None, 0
    key = child.key
    end = pos + len(key)
    if end <= n and token_ids[pos:end] == key:
        return child, len(key)
    # the first page is known equal (it is the child's name)
    limit, i = min(len(key), n - pos), block_size
    while i < limit and key[i:i + block_size] == token_ids[pos + i:pos + i + block_size]:
        i += block_size
    return child, i


def descend(root: RadixNode, token_ids: list[int], n: int,
            block_size: int) -> tuple[RadixNode, int]:
    """The deepest node the cached path of ``token_ids[:n]`` (``n`` page-aligned) reaches
    (the one it ends inside, if any) and the tokens it matches. No split, no LRU touch."""
    node, pos = root, 0
    while pos < n:
        child, matched = match_child(node, token_ids, pos, n, block_size)
        if child is None:
            break
        pos += matched
        node = child
        if matched < len(child.key):
            break
    return node, pos


def iter_nodes(root: RadixNode) -> Iterator[RadixNode]:
    """Every node below ``root``, parents before children."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())
