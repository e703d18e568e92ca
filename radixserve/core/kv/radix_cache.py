"""RadixCache: SGLang-style page-granular radix tree over token ids, holding KV block ids.

Every node's key is a whole number of pages (``block_size`` tokens) and it holds one block id
per page; children are keyed by their first page. Matching and inserting split a node at a page
boundary when a sequence diverges inside it; the deeper half keeps its identity (and so any
handle to it), the new upper half inherits its lock count::

    block_size 2: insert [1 2 3 4 5 6] -> blocks [a b c], then match [1 2 3 4 9 9 7]

    root                                  root
     `- [1 2|3 4|5 6] [a b c]     ->       `- [1 2|3 4] [a b]       <- handle, 4 tokens matched
                                               `- [5 6] [c]          (the tail 7 is never matched)

Ownership: the tree holds ONE block-pool reference per cached block (``share`` on insert,
``free`` on evict). A request that matched holds its own reference too (the KV manager shares
the matched blocks) and locks the matched path, so locked blocks cannot be evicted under it.

Eviction frees the least recently used unlocked leaf first; a leaf only partly needed gives up
its tail pages. The candidates are a lazy min-heap (radix_lru.py: `LeafHeap`), so evicting k
blocks costs O(k log n), not a scan of the tree.

Layout: plain ``@dataclass(slots=True)`` node objects (radix_node.py: `RadixNode` and the
read-only walks down the tree; radix_integrity.py: the invariants `check_integrity` asserts).
The alternative, an arena (parallel lists indexed by node number, free list of slots, int heap
entries), is kept in ``benchmarks/bench_radix_cache.py`` and was measured there (tree of 100k
blocks, block_size 16, 2000-token prompts, us per op, medians, four runs on a noisy 2-core
box): match_prefix 9-12 vs 11-13, match+lock+release 50-70 vs 58-72, the same in a full pool
(evicting) 68-91 vs 71-101. The arena never won, so the simpler objects stay.

KV groups (kv_groups.py): with sliding-window layers a node holds one table per group —
``blocks`` for the first group, ``window_blocks`` for the others, ``units_per_page`` ids a
page — and a sliding group's page may hold the null block (released). Counters are in pool
units. What is found and kept for those groups is the cache's window policy
(``radix_windows.py``: `SlidingWindows`, or the null object `FullAttention` with one group).

KV events (kv_events.py): a new leaf's pages are reported ``stored`` (chained to the page
before it), pages eviction drops ``removed``, a ``reset`` ``cleared``. Each node keeps its
pages' hashes in ``hashes`` (empty with the null sink `NoKVEvents`, the default); a sliding
group's ``forget`` removes nothing, as the first group's page stays cached.

Disk tier (disk_hooks.py): evicted pages are offered to it before their blocks are freed.

Recurrent layers (hybrid models): a match is cut back to the deepest node holding a snapshot
of the recurrent state at its end (``radix_snapshots.py``: `Snapshots`; the null object
`NoSnapshots` for attention-only models).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.disk_hooks import DiskTier, NoDiskTier
from radixserve.core.kv.kv_events import KVEvents, NoKVEvents
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.prefix_cache import PrefixMatch
from radixserve.core.kv.radix_integrity import TreeCounts, check_tree
from radixserve.core.kv.radix_lru import LeafHeap
from radixserve.core.kv.radix_node import RadixNode, descend, iter_nodes, match_child
from radixserve.core.kv.radix_snapshots import NoSnapshots, Snapshots
from radixserve.core.kv.radix_summary import summarize
from radixserve.core.kv.radix_windows import window_policy
from radixserve.core.reports import CacheNodeInfo


class RadixCache:
    """The radix-tree ``PrefixCache``. Handles are nodes (the root for an empty match)."""

    reuses_prefixes = True

    def __init__(self, block_pool: BlockPool, block_size: int,
                 groups: KVGroups | None = None, events: KVEvents | None = None,
                 snapshots: Snapshots | None = None, disk: DiskTier | None = None) -> None:
        """``groups``: the model's KV groups (default: one group, one id a page);
        ``events``: where stored and removed pages are reported (default: nowhere);
        ``snapshots``: a hybrid model's recurrent-state snapshots (default: none needed);
        ``disk``: the tier evicted pages are saved to (default: none; one KV group only)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_pool = block_pool
        self.block_size = block_size
        self.groups = (groups or KVGroups.single(0)).groups
        self.events = events or NoKVEvents()
        self.snapshots = snapshots or NoSnapshots()
        self.disk = disk or NoDiskTier()
        assert disk is None or len(self.groups) == 1, "the disk tier takes one KV group"
        self._window = window_policy(self.groups, block_pool, block_size, self._descend,
                                     self._add_units)
        self.root = RadixNode([], [], None, 0, 0, window_blocks=[[] for _ in self.groups[1:]])
        self._uids = itertools.count(1)
        self._clock = 0  # LRU time: ticks once per match/insert
        self._lru = LeafHeap()
        self._num_nodes = 0  # excluding the root
        self._evictable = 0  # blocks in nodes with lock_ref == 0
        self._protected = 0  # blocks in nodes with lock_ref > 0
        self.num_queries_tokens = 0
        self.num_hit_tokens = 0

    # -- PrefixCache -----------------------------------------------------------------------

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Longest cached page-aligned prefix; splits the last node if the match ends inside it.

        Touches the LRU time of the matched path. ``handle`` is the deepest matched node.
        """
        tables: list[list[int]] = [[] for _ in self.groups]
        n = self._window.hit_limit(token_ids, len(token_ids) - len(token_ids) % self.block_size)
        node, num_tokens = self._walk(token_ids, n, tables)
        node, usable = self.snapshots.hit(node, num_tokens)
        past: list[int] = []
        if usable < num_tokens:  # a hybrid model resumes at its deepest snapshot
            pages, num_tokens = usable // self.block_size, usable
            past = tables[0][pages * self.groups[0].units_per_page:]
            for group, table in zip(self.groups, tables):
                del table[pages * group.units_per_page:]
        self.num_queries_tokens += len(token_ids)
        self.num_hit_tokens += num_tokens
        hit = node
        while hit.parent is not None:
            hit.hits += 1
            hit = hit.parent
        self._window.null_unneeded(tables, num_tokens)
        return PrefixMatch(tables[0], num_tokens, node, tables[1:], node.snapshot, past)

    def cached_len(self, token_ids: list[int]) -> int:
        """Tokens of ``token_ids`` that ``match_prefix`` would find now, without its side
        effects: no split, no LRU touch, not counted in the hit statistics."""
        n = len(token_ids) - len(token_ids) % self.block_size
        node, pos = self._descend(token_ids, n)
        return self.snapshots.hit_len(node, self._window.hit_len(node, pos))

    def lock(self, handle: RadixNode | None) -> None:
        """Ref count +1 on every node from ``handle`` up to (not including) the root."""
        node = handle
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= node.units
                self._protected += node.units
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: RadixNode | None) -> None:
        """Undo one ``lock(handle)``; a leaf dropping to 0 becomes an eviction candidate."""
        node = handle
        while node is not None and node.parent is not None:
            assert node.lock_ref > 0, "unlock of an unlocked node"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= node.units
                self._evictable += node.units
            node = node.parent
        if handle is not None and handle.parent is not None:
            self._push_if_candidate(handle)

    def release(self, token_ids: list[int], block_ids: list[int], handle: RadixNode | None,
                window_block_ids: list[list[int]] = ()) -> RadixNode:
        """A request is done: cache its full pages, unlock ``handle``, drop all its references.

        ``block_ids[i]`` holds the KV of page ``i`` of ``token_ids``; the non-page-aligned tail
        and any extra blocks are not cached. Pages already in the tree keep the tree's block
        (the request's duplicate is freed; a sliding page the tree had released takes the
        request's); new pages make the tree take a reference. Returns the node that ends at
        the last full page (where a snapshot of the request's state may go).
        """
        tables = [block_ids, *window_block_ids]
        node = self._insert(token_ids, tables)
        self.unlock(handle)
        for table in tables:
            self.block_pool.free(self._window.owned(table))
        return node

    def attach_snapshot(self, node: RadixNode, slot: int, end: int) -> bool:
        """Keep state-pool ``slot`` (the recurrent state after ``end`` tokens, page-aligned,
        on ``node``'s path: ``0 < end <= node.end``) on the node ending there (split off if
        none does); False when it is not taken (that node has one, or none are kept)."""
        while node.parent is not None and node.parent.end >= end:
            node = node.parent
        if node.parent is None or not self.snapshots.keeps:
            return False
        if node.end != end:
            node = self._split(node, (end - node.parent.end) // self.block_size)
        return self.snapshots.attach(node, slot)

    def evict_snapshot(self) -> bool:
        """Free the least recently used snapshot that is not pinned; False if none."""
        return self.snapshots.evict_one()

    def pin_snapshot(self, node: RadixNode, pinned: bool) -> None:
        """Keep (``pinned``) or no longer keep the snapshot a hit on ``node`` copies."""
        (self.snapshots.pin if pinned else self.snapshots.unpin)(node)

    def forget(self, handle: RadixNode | None, group: int, lo: int, released: list[int],
               keep_end: int = 0) -> None:
        """Drop the tree's copies of the released pages from ``lo`` on of sliding ``group``
        on ``handle``'s path that no likely hit needs (`SlidingWindows.forget`)."""
        if handle is not None and handle.parent is not None:
            self._window.forget(handle, group, lo, released, keep_end)

    def cache_blocks(self, token_ids: list[int], block_ids: list[int],
                     window_block_ids: list[list[int]] = ()) -> RadixNode:
        """Cache the full pages of a still-running request; return the new deepest node.

        Same insertion as ``release`` but nothing is unlocked or freed: the request keeps every
        reference it holds and keeps using its own block table (where a page was already cached
        under another block, the request's block stays a private duplicate, freed by its
        ``release``). The caller should ``lock`` the returned handle, then ``unlock`` the old
        one, and later pass the new handle to ``release``; until locked, the new pages are
        evictable (which only drops the tree's reference, never the request's).
        """
        return self._insert(token_ids, [block_ids, *window_block_ids])

    def evict(self, num_blocks: int) -> int:
        """Free ``num_blocks`` blocks of unlocked leaves, least recently used first (a few
        more with several KV groups: a page's units go together).

        A parent whose last child goes becomes a leaf and a candidate in turn. Returns the
        number of tree references dropped (each returns a block to the pool, as no request
        holds an unlocked block).
        """
        freed, bs = 0, self.block_size
        while freed < num_blocks and (node := self._lru.least_recent()) is not None:
            pages, units = self._window.tail(node, num_blocks - freed)
            if pages:  # its end goes (NOTE: first: the disk keys the snapshot by that end)
                self.snapshots.dropped(node)
            self.disk.evicting(node, units)  # NOTE: before the free: then the rows are intact
            self.block_pool.free(units)
            self._evictable -= len(units)
            node.units -= len(units)
            freed += len(units)
            if pages * bs < len(node.key):  # (then the loop ends: enough was freed)
                for group, table in zip(self.groups, node.tables):
                    del table[len(table) - pages * group.units_per_page:]
                del node.key[-pages * bs:]
                node.end -= pages * bs
                if node.hashes and pages:
                    self.events.removed(node.hashes[-pages:])
                    del node.hashes[-pages:]
            else:
                self._lru.pop()
                self.events.removed(node.hashes)
                self._remove_leaf(node)
        return freed

    def reset(self) -> bool:
        """Drop every cached page (vLLM's ``reset_prefix_cache``), reported as ``cleared``;
        only while no request holds a locked path. Returns whether it did."""
        if any(child.lock_ref for child in self.root.children.values()):
            return False
        self.snapshots.clear()
        for node in list(self._nodes()):
            for table in node.tables:
                self.block_pool.free(self._window.owned(table))
            node.parent = None
        self.root.children.clear()
        self._lru.clear()
        self._num_nodes = self._evictable = 0
        self.events.cleared()
        return True

    @property
    def num_evictable_blocks(self) -> int:
        return self._evictable

    @property
    def num_protected_blocks(self) -> int:
        return self._protected

    @property
    def num_cached_blocks(self) -> int:
        return self._evictable + self._protected

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    def summary(self, max_nodes: int, max_depth: int) -> list[CacheNodeInfo]:
        """The top of the tree, read-only and bounded (`radix_summary.summarize`)."""
        return summarize(self.root, max_nodes, max_depth)

    def check_integrity(self) -> None:
        """Walk the whole tree (`radix_integrity.check_tree`); assert its invariants and that
        the incremental counters match it."""
        found = check_tree(self.root, self.groups, self.block_size, self.block_pool,
                           self._lru.uids())
        counted = TreeCounts(self._num_nodes, self._evictable, self._protected)
        assert found == counted, f"the tree holds {found}, counted {counted}"
        self.snapshots.check(list(self._nodes()))

    # -- internals -------------------------------------------------------------------------

    def _walk(self, token_ids: list[int], n: int,
              tables: list[list[int]] | None) -> tuple[RadixNode, int]:
        """Descend along ``token_ids[:n]`` (``n`` page-aligned) while whole pages match.

        Appends the matched blocks to ``tables`` (one list per group, if given) and stamps
        the path with a new LRU time.
        Returns ``(node, pos)``: the deepest node, whose path spells ``token_ids[:pos]``
        exactly (the node it stopped inside is split at ``pos``).
        """
        self._clock += 1
        now = self._clock
        node, pos = self.root, 0
        while pos < n:
            child, matched = match_child(node, token_ids, pos, n, self.block_size)
            if child is None:
                break
            pos += matched
            inside = matched < len(child.key)
            if inside:  # the match ends inside this node: split it there
                child = self._split(child, matched // self.block_size)
            child.last_access = now  # (after a split: the unmatched lower half keeps its time)
            if tables is not None:
                tables[0] += child.blocks
                for table, more in zip(tables[1:], child.window_blocks):
                    table += more
            node = child
            if inside:
                break
        return node, pos

    def _descend(self, token_ids: list[int], n: int) -> tuple[RadixNode, int]:
        return descend(self.root, token_ids, n, self.block_size)

    def _split(self, child: RadixNode, pages: int) -> RadixNode:
        """Cut ``child`` after ``pages`` pages; return the new upper node (same lock count).

            parent -> child[key 0:len]   becomes   parent -> upper[0:cut] -> child[cut:len]
        """
        bs, cut, parent = self.block_size, pages * self.block_size, child.parent
        assert parent is not None and 0 < cut < len(child.key)
        cuts = [pages * g.units_per_page for g in self.groups]
        upper = RadixNode(child.key[:cut], child.blocks[:cuts[0]], parent, child.last_access,
                          next(self._uids), lock_ref=child.lock_ref, hits=child.hits,
                          window_blocks=[t[:c] for t, c in zip(child.window_blocks, cuts[1:])],
                          end=parent.end + cut, hashes=child.hashes[:pages])
        upper.units = self._count_units(upper)
        child.units -= upper.units
        parent.children[tuple(child.key[:bs])] = upper
        child.key = child.key[cut:]
        child.blocks = child.blocks[cuts[0]:]
        child.window_blocks = [t[c:] for t, c in zip(child.window_blocks, cuts[1:])]
        child.hashes = child.hashes[pages:]
        child.parent = upper
        upper.children[tuple(child.key[:bs])] = child
        self._num_nodes += 1
        return upper

    def _insert(self, token_ids: list[int], tables: list[list[int]]) -> RadixNode:
        """Cache the full pages of ``token_ids`` (KV in ``tables``, one per group); return the
        deepest node.

        Pages already cached keep their block (a sliding page the tree released takes the
        request's); the new ones become one leaf whose blocks the tree takes a reference to.
        """
        bs = self.block_size
        num_pages = len(token_ids) // bs
        m0 = self.groups[0].units_per_page
        assert len(tables[0]) >= num_pages * m0, f"{len(tables[0])} blocks, {num_pages} pages"
        n = num_pages * bs
        node, pos = self._walk(token_ids, n, None)
        self._window.fill(node, tables, pos)
        if pos == n:
            return node
        first = pos // bs
        parts = [t[first * g.units_per_page:num_pages * g.units_per_page]
                 for g, t in zip(self.groups, tables)]
        key = token_ids[pos:n]
        parent_hash = node.hashes[-1] if node.hashes else None
        leaf = RadixNode(key, parts[0], node, self._clock, next(self._uids),
                         window_blocks=parts[1:], end=n,
                         hashes=self.events.stored(parent_hash, key))
        leaf.units = self._count_units(leaf)
        for part in parts:
            self.block_pool.share(self._window.owned(part))
        node.children[tuple(leaf.key[:bs])] = leaf
        self._num_nodes += 1
        self._evictable += leaf.units
        self._push_if_candidate(leaf)
        return leaf

    def _count_units(self, node: RadixNode) -> int:
        return sum(len(self._window.owned(t)) for t in node.tables)

    def _add_units(self, node: RadixNode, units: int) -> None:
        """``node`` holds ``units`` more pool references (fewer if negative)."""
        node.units += units
        if node.lock_ref:
            self._protected += units
        else:
            self._evictable += units

    def _remove_leaf(self, node: RadixNode) -> None:
        """Unlink an emptied leaf (its blocks already freed); its parent may become a candidate."""
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0
        del parent.children[tuple(node.key[:self.block_size])]
        self.snapshots.dropped(node)
        node.parent = None
        self._num_nodes -= 1
        if parent.parent is not None:
            self._push_if_candidate(parent)

    def _push_if_candidate(self, node: RadixNode) -> None:
        self._lru.push_if_candidate(node, self._num_nodes, self._nodes)

    def _nodes(self) -> Iterator[RadixNode]:
        return iter_nodes(self.root)
