"""RadixCache micro-benchmark: us per operation on a tree holding ~100,000 blocks.

Run: .venv/bin/python benchmarks/bench_radix_cache.py [--blocks N] [--ops N] [--repeats N]

Prompts are 2,000 tokens (block_size 16, vocabulary 32,000) with shared prefixes, as a chat
server sees them: one of 16 system prompts (400 tokens), one of 128 contexts (600 tokens, each
tied to one system prompt), then a unique tail (1,000 tokens). The 400 and 1,000 boundaries
fall inside pages, so matches split nodes. The tree is filled to ``--blocks`` cached blocks,
then new prompts of the same shape are timed:

* ``match``: ``match_prefix`` alone (~1,000 tokens hit, 62 blocks);
* ``cycle``: what a request costs the cache: match, lock, share, allocate the rest, release
  (which inserts the new tail), in a pool with room to spare;
* ``cycle+evict``: the same in a full pool, so every request first evicts ~63 LRU blocks.

Both node layouts are timed: ``RadixCache`` (``@dataclass(slots=True)`` nodes, the one shipped)
and ``ArenaRadixCache`` below (parallel lists indexed by node number, free list of slots), kept
here only as the measured alternative; it implements the same semantics.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import statistics
import time

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.prefix_cache import PrefixMatch
from radixserve.core.kv.radix_cache import RadixCache

BS, VOCAB = 16, 32000
SYS, CTX, TAIL = 400, 600, 1000


class ArenaRadixCache:
    """The rejected layout: node ``i`` is ``key[i], blocks[i], children[i], parent[i]...``.

    Node 0 is the root; ``parent[i] == -1`` marks the root and dead slots.
    """

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool, self.block_size = block_pool, block_size
        self.key: list[list[int]] = [[]]
        self.blocks: list[list[int]] = [[]]
        self.children: list[dict[tuple[int, ...], int]] = [{}]
        self.parent, self.last, self.lock_ref = [-1], [0], [0]
        self._free_slots: list[int] = []
        self._heap: list[tuple[int, int]] = []
        self._clock = self._num_nodes = self._evictable = self._protected = 0

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        blocks: list[int] = []
        n = len(token_ids) - len(token_ids) % self.block_size
        node, pos = self._walk(token_ids, n, blocks)
        return PrefixMatch(blocks, pos, node)

    def lock(self, node: int) -> None:
        parent, lock_ref, blocks = self.parent, self.lock_ref, self.blocks
        while parent[node] != -1:
            if lock_ref[node] == 0:
                self._evictable -= len(blocks[node])
                self._protected += len(blocks[node])
            lock_ref[node] += 1
            node = parent[node]

    def unlock(self, handle: int) -> None:
        parent, lock_ref, blocks, node = self.parent, self.lock_ref, self.blocks, handle
        while parent[node] != -1:
            lock_ref[node] -= 1
            if lock_ref[node] == 0:
                self._protected -= len(blocks[node])
                self._evictable += len(blocks[node])
            node = parent[node]
        if parent[handle] != -1:
            self._push_if_candidate(handle)

    def release(self, token_ids: list[int], block_ids: list[int], handle: int) -> None:
        self._insert(token_ids, block_ids)
        self.unlock(handle)
        self.block_pool.free(block_ids)

    def evict(self, num_blocks: int) -> int:
        heap, freed = self._heap, 0
        parent, children, lock_ref, last = self.parent, self.children, self.lock_ref, self.last
        while freed < num_blocks and heap:
            when, node = heap[0]
            if parent[node] == -1 or children[node] or lock_ref[node]:
                heapq.heappop(heap)
                continue
            if when != last[node]:
                heapq.heapreplace(heap, (last[node], node))
                continue
            blocks = self.blocks[node]
            take = min(num_blocks - freed, len(blocks))
            self.block_pool.free(blocks[-take:])
            self._evictable -= take
            freed += take
            if take < len(blocks):
                del blocks[-take:]
                del self.key[node][-take * self.block_size:]
            else:
                heapq.heappop(heap)
                self._remove_leaf(node)
        return freed

    @property
    def num_evictable_blocks(self) -> int:
        return self._evictable

    def _walk(self, token_ids: list[int], n: int, blocks: list[int]) -> tuple[int, int]:
        bs, keys, children, last = self.block_size, self.key, self.children, self.last
        self._clock += 1
        now = self._clock
        node = pos = 0
        while pos < n:
            child = children[node].get(tuple(token_ids[pos:pos + bs]))
            if child is None:
                break
            key = keys[child]
            end = pos + len(key)
            if end <= n and token_ids[pos:end] == key:
                last[child] = now
                blocks += self.blocks[child]
                node, pos = child, end
                continue
            limit, i = min(len(key), n - pos), bs
            while i < limit and key[i:i + bs] == token_ids[pos + i:pos + i + bs]:
                i += bs
            node = self._split(child, i // bs)
            last[node] = now
            blocks += self.blocks[node]
            pos += i
            break
        return node, pos

    def _new(self, key: list[int], blocks: list[int], parent: int, last: int, lock: int) -> int:
        self._num_nodes += 1
        if self._free_slots:
            i = self._free_slots.pop()
            self.key[i], self.blocks[i], self.children[i] = key, blocks, {}
            self.parent[i], self.last[i], self.lock_ref[i] = parent, last, lock
            return i
        self.key.append(key)
        self.blocks.append(blocks)
        self.children.append({})
        self.parent.append(parent)
        self.last.append(last)
        self.lock_ref.append(lock)
        return len(self.key) - 1

    def _split(self, child: int, pages: int) -> int:
        bs, cut, parent = self.block_size, pages * self.block_size, self.parent[child]
        key, blocks = self.key[child], self.blocks[child]
        upper = self._new(key[:cut], blocks[:pages], parent, self.last[child],
                          self.lock_ref[child])
        self.children[parent][tuple(key[:bs])] = upper
        self.key[child], self.blocks[child] = key[cut:], blocks[pages:]
        self.parent[child] = upper
        self.children[upper][tuple(key[cut:cut + bs])] = child
        return upper

    def _insert(self, token_ids: list[int], block_ids: list[int]) -> int:
        bs = self.block_size
        num_pages = len(token_ids) // bs
        n = num_pages * bs
        node, pos = self._walk(token_ids, n, [])
        if pos == n:
            return node
        leaf = self._new(token_ids[pos:n], block_ids[pos // bs:num_pages], node, self._clock, 0)
        self.block_pool.share(self.blocks[leaf])
        self.children[node][tuple(token_ids[pos:pos + bs])] = leaf
        self._evictable += len(self.blocks[leaf])
        self._push_if_candidate(leaf)
        return leaf

    def _remove_leaf(self, node: int) -> None:
        parent = self.parent[node]
        del self.children[parent][tuple(self.key[node][:self.block_size])]
        self.parent[node] = -1
        self.key[node] = self.blocks[node] = []
        self._free_slots.append(node)
        self._num_nodes -= 1
        if self.parent[parent] != -1:
            self._push_if_candidate(parent)

    def _push_if_candidate(self, node: int) -> None:
        if self.children[node] or self.lock_ref[node]:
            return
        heap = self._heap
        heapq.heappush(heap, (self.last[node], node))
        if len(heap) > 2 * self._num_nodes + 64:
            parent, children, lock_ref = self.parent, self.children, self.lock_ref
            heap[:] = [(self.last[i], i) for i in range(1, len(parent))
                       if parent[i] != -1 and not children[i] and not lock_ref[i]]
            heapq.heapify(heap)


class Workload:
    """Prompts of 2,000 tokens: system prompt + context + unique tail (see the module doc)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sys = [self._tokens(SYS) for _ in range(16)]
        self.ctx = [(i % 16, self._tokens(CTX)) for i in range(128)]

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def prompt(self) -> list[int]:
        s, ctx = self.rng.choice(self.ctx)
        return self.sys[s] + ctx + self._tokens(TAIL)


def serve(cache, pool: BlockPool, tokens: list[int]) -> None:
    """A request's whole life as the KV manager drives the cache."""
    m = cache.match_prefix(tokens)
    cache.lock(m.handle)
    pool.share(m.block_ids)
    need = -(-len(tokens) // BS) - len(m.block_ids)
    short = need - pool.num_free_blocks
    if short > 0:
        cache.evict(short)
    cache.release(tokens, m.block_ids + pool.allocate(need), m.handle)


def build(cls, num_blocks: int, pool_blocks: int, seed: int):
    pool = BlockPool(pool_blocks)
    cache = cls(pool, BS)
    work = Workload(seed)
    while pool.num_blocks - pool.num_free_blocks < num_blocks:
        serve(cache, pool, work.prompt())
    return pool, cache, work


def per_op_us(fn, prompts: list[list[int]]) -> float:
    """Mean us per call; the cyclic GC is off while timing, as in ``timeit``."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for p in prompts:
            fn(p)
        return (time.perf_counter() - t0) / len(prompts) * 1e6
    finally:
        gc.enable()


def bench(cls, num_blocks: int, ops: int, seed: int) -> dict[str, float]:
    headroom = ops * (-(-(SYS + CTX + TAIL) // BS))
    pool, cache, work = build(cls, num_blocks, num_blocks + headroom, seed)
    prompts = [work.prompt() for _ in range(ops)]
    out = {"match": per_op_us(cache.match_prefix, prompts)}
    out["hit tokens"] = statistics.mean(cache.match_prefix(p).num_tokens for p in prompts)
    out["cycle"] = per_op_us(lambda p: serve(cache, pool, p), prompts)
    pool, cache, work = build(cls, num_blocks, num_blocks, seed)  # full: every cycle evicts
    prompts = [work.prompt() for _ in range(ops)]
    out["cycle+evict"] = per_op_us(lambda p: serve(cache, pool, p), prompts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"tree of {args.blocks} blocks (block_size {BS}), {args.ops} new 2000-token prompts, "
          f"median of {args.repeats}; us per op")
    print(f"{'layout':<22}{'match':>9}{'cycle':>9}{'cycle+evict':>13}{'hit tokens':>12}")
    layouts = (RadixCache, ArenaRadixCache)
    runs: dict[type, list[dict[str, float]]] = {cls: [] for cls in layouts}
    for r in range(args.repeats):  # interleaved, alternating which layout goes first
        for cls in layouts if r % 2 == 0 else layouts[::-1]:
            runs[cls].append(bench(cls, args.blocks, args.ops, args.seed + r))
    for cls in layouts:
        med = {k: statistics.median(r[k] for r in runs[cls]) for k in runs[cls][0]}
        print(f"{cls.__name__:<22}{med['match']:>9.1f}{med['cycle']:>9.1f}"
              f"{med['cycle+evict']:>13.1f}{med['hit tokens']:>12.0f}")


if __name__ == "__main__":
    main()
