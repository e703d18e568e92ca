"""What the radix tree finds, keeps and evicts for sliding-window KV groups (kv_groups.py).

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
import heapq


def hit_len(cache, token_ids: list[int], n: int) -> int:
    """Tokens of the longest cached page-aligned prefix of ``token_ids[:n]`` whose sliding
    groups hold the window before it; read-only.

    The whole match is found as without groups (whole keys compared at once); then the hit
    point h steps back from its end: a page missing from the window before h rules out every
    hit point from it up to h, so h becomes that page. Cost: the match plus about a window's
    pages per sliding group when the window is there.
    """
    bs, null = cache.block_size, cache.block_pool.null_block
    firsts, nodes = [], []  # each matched node's first page
    node, pos = cache.root, 0
    while pos < n:
        child, matched = cache._match_child(node, token_ids, pos, n)
        if child is None:
            break
        firsts.append(pos // bs)
        nodes.append(child)
        pos += matched
        if matched < len(child.key):
            break
        node = child
    h = pos // bs
    sliding = [(g, group) for g, group in enumerate(cache.groups) if group.is_sliding]
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


def null_unneeded(cache, tables: list[list[int]], num_tokens: int) -> None:
    """Replace, in a match's ``tables``, the pages of sliding groups that a request resuming
    at ``num_tokens`` never reads by the null block (it takes no reference to them)."""
    null = cache.block_pool.null_block
    for group, table in zip(cache.groups, tables):
        first = group.first_needed_page(num_tokens, cache.block_size) * group.units_per_page
        table[:first] = [null] * first


def fill(cache, node, tables: list[list[int]], end: int) -> None:
    """On the path ending at ``node`` (``end`` tokens), give each sliding page the tree has
    released the request's block for it, where the request holds one (``tables``)."""
    bs, null = cache.block_size, cache.block_pool.null_block
    for g, group in enumerate(cache.groups):
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
                    cache.block_pool.share(units)
                    _count(cache, x, m)
            x = x.parent


def forget(cache, handle, g: int, lo: int, released: list[int], keep_end: int) -> None:
    """Drop the tree's copies of the pages from ``lo`` on of group ``g`` that a request
    released (``released``: their ids) on ``handle``'s path — where the tree holds the
    request's own block — but those in the window before an anchor (a node that branches,
    page ``keep_end``)."""
    bs, null, group = cache.block_size, cache.block_pool.null_block, cache.groups[g]
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
            cache.block_pool.free(mine[i:i + m])
            mine[i:i + m] = [null] * m
            _count(cache, x, -m)


def evict(cache, num_blocks: int) -> int:
    """``RadixCache.evict`` with several groups: tail pages, each with all its units."""
    heap, freed, bs, null = cache._heap, 0, cache.block_size, cache.block_pool.null_block
    while freed < num_blocks and heap:
        when, _, node = heap[0]
        if node.parent is None or node.children or node.lock_ref:
            heapq.heappop(heap)
            continue
        if when != node.last_access:
            heapq.heapreplace(heap, (node.last_access, node.uid, node))
            continue
        num_pages, take, units = len(node.key) // bs, 0, []
        while freed + len(units) < num_blocks and take < num_pages:
            take += 1
            k = num_pages - take
            for group, table in zip(cache.groups, node.tables):
                m = group.units_per_page
                units += [b for b in table[k * m:(k + 1) * m] if b != null]
        cache.block_pool.free(units)
        cache._evictable -= len(units)
        node.units -= len(units)
        freed += len(units)
        if take < num_pages:
            for group, table in zip(cache.groups, node.tables):
                del table[(num_pages - take) * group.units_per_page:]
            del node.key[-take * bs:]
            node.end -= take * bs
        else:
            heapq.heappop(heap)
            cache._remove_leaf(node)
    return freed


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


def _count(cache, node, units: int) -> None:
    node.units += units
    if node.lock_ref:
        cache._protected += units
    else:
        cache._evictable += units
