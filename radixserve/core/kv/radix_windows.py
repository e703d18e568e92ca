"""What the radix tree finds, keeps and evicts for sliding-window KV groups (kv_groups.py): the
window policy `RadixCache` calls, `SlidingWindows`, and its null object `FullAttention` (a model
without sliding layers: every page is kept and a match is the whole cached path).

A query at position p of a sliding group reads only pages ``first_needed_page(p)`` .. p's
page, so a request releases older pages (the null block takes their table slots) and the tree
does not need them either — except for a later hit: a request resuming at the hit point h
needs the window of pages just before h::

    pages on the matched path:   0 1 2 3 4 5 6 7 8
    sliding group (window 3 pages) · · · # # · # # #      (#: present, ·: released)
    hit at 9: pages 6-8 present -> ok;  hit at 6: pages 3-5 not all present -> no

The rules, all correct by construction (the first is what makes hits right):

- match: the hit is cut back to the longest page-aligned prefix at which every sliding group
  has its window's pages present; the pages before that window are handed out as null.
- forget: when a running request releases pages it computed and cached itself, the tree
  drops them too (pages a hit gave it, or another request's copies, stay: the tree kept
  them for someone else), unless they lie in the window before an *anchor* on the path, a
  point later requests
  most likely resume from: a node where the path branches (a shared system prompt) and the
  hit point of the request's own prompt (the same prompt again, retries). Otherwise a long
  request's locked path would pin every page and nothing would be saved; this way it pins
  at most a window per anchor. (Its moving frontier is no anchor; see fill.)
- fill: inserting a path whose sliding pages the tree had dropped gives it the inserting
  request's pages where it still holds them: a finished request leaves its last window, so
  the next turn of a conversation hits its end.
- evict: a leaf's tail pages go with all their groups' units.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Protocol

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroup

# Nodes are radix_node.RadixNode records: ``key``, ``end`` (tokens from the root to the end of its
# key), ``parent`` (None: the root), ``children``, ``tables`` (one block table per group).
Node = Any


class WindowPolicy(Protocol):
    """What `RadixCache` asks about its KV groups' windows. The methods that take a node read
    or write only that node's path and tables, and report a change of a node's pool references
    through the cache's ``add_units`` (given at construction), never touching the cache."""

    def hit_limit(self, token_ids: list[int], n: int) -> int:
        """Where a match of ``token_ids[:n]`` (``n`` page-aligned) may end at most; read-only."""

    def hit_len(self, node: Node, pos: int) -> int:
        """The hit of a cached path that spells its first ``pos`` tokens down to ``node`` (the
        node it ends inside, if any); read-only."""

    def null_unneeded(self, tables: list[list[int]], num_tokens: int) -> None:
        """Null, in a match's ``tables``, the pages a request resuming at ``num_tokens``
        never reads (it takes no reference to them)."""

    def owned(self, table: list[int]) -> list[int]:
        """The ids of ``table`` that are pool references (not the null block)."""

    def fill(self, node: Node, tables: list[list[int]], end: int) -> None:
        """After an insert along the path ending at ``node`` (``end`` tokens): give its
        released pages the inserting request's blocks (``tables``) where it holds them."""

    def forget(self, handle: Node, g: int, lo: int, released: list[int],
               keep_end: int) -> None:
        """Drop the tree's copies of pages of group ``g`` a request released (see `forget`)."""

    def tail(self, node: Node, wanted: int) -> tuple[int, list[int]]:
        """Eviction of leaf ``node``: how many tail pages to cut to free ``wanted`` pool
        references (all of them at most), and those references; read-only."""


class FullAttention:
    """Null object: no sliding group, every cached page is held and found."""

    def hit_limit(self, token_ids: list[int], n: int) -> int:
        return n

    def hit_len(self, node: Node, pos: int) -> int:
        return pos

    def null_unneeded(self, tables: list[list[int]], num_tokens: int) -> None:
        pass

    def owned(self, table: list[int]) -> list[int]:
        return table

    def fill(self, node: Node, tables: list[list[int]], end: int) -> None:
        pass

    def forget(self, handle: Node, g: int, lo: int, released: list[int],
               keep_end: int) -> None:
        pass

    def tail(self, node: Node, wanted: int) -> tuple[int, list[int]]:
        take = min(wanted, len(node.blocks))  # one group, one id a page
        return take, node.blocks[-take:]


FULL_ATTENTION = FullAttention()


def window_policy(groups: tuple[KVGroup, ...], block_pool: BlockPool, block_size: int,
                  descend: Callable[[list[int], int], tuple[Node, int]],
                  add_units: Callable[[Node, int], None]) -> WindowPolicy:
    """`SlidingWindows` when a group slides, else `FULL_ATTENTION`. ``descend(token_ids, n)``:
    the cache's read-only walk, ``(node, pos)`` as `WindowPolicy.hit_len` takes them;
    ``add_units(node, units)``: count ``units`` more pool references held by ``node``."""
    if not any(g.is_sliding for g in groups):
        return FULL_ATTENTION
    return SlidingWindows(groups, block_pool, block_size, descend, add_units)


class SlidingWindows:
    """The rules of the module docstring for a tree with sliding groups (needs the pool's
    null block)."""

    def __init__(self, groups: tuple[KVGroup, ...], block_pool: BlockPool, block_size: int,
                 descend: Callable[[list[int], int], tuple[Node, int]],
                 add_units: Callable[[Node, int], None]) -> None:
        assert block_pool.null_block is not None, "needs a null block"
        self.groups = groups
        self.block_pool = block_pool
        self.block_size = block_size
        self.null = block_pool.null_block
        self._descend = descend
        self._add_units = add_units

    def hit_limit(self, token_ids: list[int], n: int) -> int:
        return self.hit_len(*self._descend(token_ids, n))

    def hit_len(self, node: Node, pos: int) -> int:
        """The longest page-aligned prefix of the path whose sliding groups hold the window
        before it. The hit point h steps back from the path's end: a page missing from the
        window before h rules out every hit point from it up to h, so h becomes that page.
        Cost: the path plus about a window's pages per sliding group when the window is there.
        """
        bs, null = self.block_size, self.null
        nodes = []
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        firsts = [(x.end - len(x.key)) // bs for x in nodes]  # each node's first page
        h = pos // bs
        sliding = [(g, group) for g, group in enumerate(self.groups) if group.is_sliding]
        while h > 0:
            missing = None
            for g, group in sliding:
                m = group.units_per_page
                for k in range(h - 1, group.first_needed_page(h * bs, bs) - 1, -1):
                    i = bisect.bisect_right(firsts, k) - 1
                    if nodes[i].tables[g][(k - firsts[i]) * m] == null:
                        missing = k
                        break
                if missing is not None:
                    break
            if missing is None:
                break
            h = missing
        return h * bs

    def null_unneeded(self, tables: list[list[int]], num_tokens: int) -> None:
        null = self.null
        for group, table in zip(self.groups, tables):
            first = group.first_needed_page(num_tokens, self.block_size) * group.units_per_page
            table[:first] = [null] * first

    def owned(self, table: list[int]) -> list[int]:
        null = self.null
        return [b for b in table if b != null]

    def fill(self, node: Node, tables: list[list[int]], end: int) -> None:
        bs, null = self.block_size, self.null
        for g, group in enumerate(self.groups):
            if not group.is_sliding:
                continue
            m, table = group.units_per_page, tables[g]
            lo = _first_present_page(table, m, null)
            x = node
            while x.parent is not None and x.end > lo * bs:
                start = (x.end - len(x.key)) // bs
                mine = x.tables[g]
                for k in range(max(start, lo), x.end // bs):
                    i = (k - start) * m
                    if mine[i] == null and table[k * m] != null:
                        units = table[k * m:(k + 1) * m]
                        mine[i:i + m] = units
                        self.block_pool.share(units)
                        self._add_units(x, m)
                x = x.parent

    def forget(self, handle: Node, g: int, lo: int, released: list[int],
               keep_end: int) -> None:
        """Drop the tree's copies of the pages from ``lo`` on of group ``g`` that a request
        released (``released``: their ids) on ``handle``'s path — where the tree holds the
        request's own block — but those in the window before an anchor (a node that branches,
        page ``keep_end``)."""
        bs, null, group = self.block_size, self.null, self.groups[g]
        m = group.units_per_page
        hi = lo + len(released) // m
        path = []
        x = handle
        while x.parent is not None and x.end > lo * bs:
            path.append(x)
            x = x.parent
        keep = set(range(group.first_needed_page(keep_end * bs, bs), keep_end))
        for x in path:
            if len(x.children) > 1:
                keep.update(range(group.first_needed_page(x.end, bs), x.end // bs))
        for x in path:
            start = (x.end - len(x.key)) // bs
            mine = x.tables[g]
            for k in range(max(start, lo), min(hi, x.end // bs)):
                i, j = (k - start) * m, (k - lo) * m
                if k in keep or mine[i] == null or mine[i:i + m] != released[j:j + m]:
                    continue
                self.block_pool.free(mine[i:i + m])
                mine[i:i + m] = [null] * m
                self._add_units(x, -m)

    def tail(self, node: Node, wanted: int) -> tuple[int, list[int]]:
        """Tail pages, each with all its groups' units (so a few more than ``wanted``)."""
        num_pages, take, units, null = len(node.key) // self.block_size, 0, [], self.null
        while len(units) < wanted and take < num_pages:
            take += 1
            k = num_pages - take
            for group, table in zip(self.groups, node.tables):
                m = group.units_per_page
                units += [b for b in table[k * m:(k + 1) * m] if b != null]
        return take, units


def _first_present_page(table: list[int], m: int, null: int) -> int:
    """A request's released pages are a prefix of its table: the first page after it."""
    lo, hi = 0, len(table) // m
    while lo < hi:
        mid = (lo + hi) // 2
        if table[mid * m] == null:
            lo = mid + 1
        else:
            hi = mid
    return lo
