"""KVDiskTier: the core's `DiskTier` (core/kv/disk_hooks.py) over a `DiskPageStore` and the
runner's page copies (runner/kv_pages.py).

Keys: a page's chained token-prefix hash (core/kv/kv_events.py `chain_hashes`, vLLM's), from a
fixed root of our own, so a key names the page's whole prefix and is the same in every
process (the KV events' root follows PYTHONHASHSEED and may be random). LoRA pages are not
saved: their keys carry the engine's adapter number, which names another adapter after a
restart.

Saving: `evicting` runs on the scheduler's thread while the evicted rows are intact; it hashes
the node's path, skips the pages the disk holds, copies the rest out of the pool (a memcpy)
and queues their write on one writer thread. Queued bytes are bounded (``max_pending_bytes``):
past it an eviction is not saved (counted). A lookup that reaches a page still queued waits
for the writes (reading it back beats computing it again).

A hybrid model's recurrent-state snapshots go the same way, one file each, keyed by
``state_key`` of the page they end (its state after that page): saved as the cache lets go of
them (`evicting_state`) and at shutdown, read back by `lookup_state` / `load_state`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from radixserve.core.kv.kv_events import LORA_KEY_SHIFT, chain_hashes, vllm_sha256
from radixserve.core.kv.radix_node import RadixNode, iter_nodes
from radixserve.kvdisk.store import DiskPageStore
from radixserve.runner.kv_pages import KVPages
from radixserve.runner.state_pages import StatePages

logger = logging.getLogger(__name__)

ROOT_HASH = vllm_sha256("radixserve kv disk tier")  # the parent of every sequence's first page
LOAD_BUFFER_BYTES = 32 << 20  # pages are read into this much memory, then copied to the pool
SHUTDOWN_SAVE_S = 5.0  # NOTE: the API process waits 10 s for the engine to exit (core_client)


def state_key(page_key: bytes) -> bytes:
    """The key of the recurrent state after the page keyed ``page_key``."""
    return hashlib.sha256(b"recurrent state " + page_key).digest()


@dataclass(slots=True)
class TierStats:
    num_pages_queued: int = 0  # handed to the writer (some may turn out on disk already)
    num_pages_dropped: int = 0  # evicted while the writer was too far behind: not saved
    num_pages_restored: int = 0  # read back into the pool
    num_states_queued: int = 0  # recurrent-state snapshots handed to the writer
    num_states_restored: int = 0
    num_bytes_queued: int = 0


class KVDiskTier:
    """Saves evicted pages to ``store`` and reads them back (see the module docstring)."""

    def __init__(self, store: DiskPageStore, pages: KVPages, block_size: int,
                 max_pending_bytes: int = 1 << 30, states: StatePages | None = None) -> None:
        """``states``: a hybrid model's state slots (None: no recurrent layers)."""
        self.store = store
        self.pages = pages
        self.states = states
        self.block_size = block_size
        self.max_pending_bytes = max_pending_bytes
        self.stats = TierStats()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-disk")
        self._lock = threading.Lock()  # guards _pending and _pending_bytes
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self._futures: list[Future] = []
        self._closed = False
        self._keys = NodeKeys(self.block_size)
        # NOTE: reused: a fresh buffer's first touch, inside readinto, measured 10x its read
        self._buf = np.zeros((max(1, LOAD_BUFFER_BYTES // pages.page_bytes), pages.page_bytes),
                             np.uint8)
        self._state_buf = np.zeros(states.slot_bytes if states else 0, np.uint8)

    # -- DiskTier ----------------------------------------------------------------------------

    def evicting(self, node: RadixNode, block_ids: list[int]) -> None:
        if self._closed or not block_ids or node.key[0] >= LORA_KEY_SHIFT:
            return
        self.stats.num_pages_queued += self._save(
            self._keys.of(node)[-len(block_ids):], block_ids, self.pages.page_bytes,
            self.pages.copy_out)
        if len(block_ids) * self.block_size == len(node.key):
            self._keys.forget(node)  # the whole node goes

    def evicting_state(self, node: RadixNode, slot: int) -> None:
        if self._closed or self.states is None or node.key[0] >= LORA_KEY_SHIFT:
            return
        key = state_key(self._keys.of(node)[-1])
        queued = self._save([key], [slot], self.states.slot_bytes,
                            lambda slots: self.states.copy_out(slots[0])[None])
        self.stats.num_states_queued += queued

    def lookup(self, token_ids: list[int], first_page: int) -> list[bytes]:
        num_pages = len(token_ids) // self.block_size
        if first_page >= num_pages or not token_ids or token_ids[0] >= LORA_KEY_SHIFT:
            return []
        # NOTE: the first miss ends the run; most prompts miss at once: probe before hashing all
        keys = chain_hashes(ROOT_HASH, token_ids[:(first_page + 1) * self.block_size],
                            self.block_size)
        if not self._has(keys[first_page]):
            return []
        keys += chain_hashes(keys[-1], token_ids[(first_page + 1) * self.block_size:],
                             self.block_size)
        found = []
        for key in keys[first_page:]:
            if not self._has(key):
                break
            found.append(key)
        return found

    def lookup_state(self, token_ids: list[int], lo: int, hi: int) -> tuple[int, bytes] | None:
        if (self.states is None or hi <= lo or not token_ids
                or token_ids[0] >= LORA_KEY_SHIFT):
            return None
        keys = chain_hashes(ROOT_HASH, token_ids[:hi * self.block_size], self.block_size)
        for k in range(hi, lo, -1):  # the deepest first: a hit resumes as late as it can
            key = state_key(keys[k - 1])
            if self._has(key):
                return k, key
        return None

    def load_state(self, handle: bytes, slot: int) -> bool:
        if self.states is None or self.store.get(handle, memoryview(self._state_buf)) is None:
            return False
        self.states.copy_in(slot, self._state_buf)
        self.stats.num_states_restored += 1
        return True

    def load(self, pages: list[bytes], block_ids: list[int]) -> int:
        num = 0
        while num < len(pages):  # a buffer's worth at a time, each file into its row
            chunk = pages[num:num + len(self._buf)]
            got = 0
            for key in chunk:
                if self.store.get(key, memoryview(self._buf[got])) is None:
                    break
                got += 1
            if got:
                self.pages.copy_in(block_ids[num:num + got], self._buf[:got])
            num += got
            if got < len(chunk):
                break
        self.stats.num_pages_restored += num
        return num

    def close(self, cache: object, time_limit_s: float = SHUTDOWN_SAVE_S) -> None:
        """Save the cached pages the disk does not hold (least recently used first, so the
        warmest get the newest mtimes; at most the budget's worth, for at most
        ``time_limit_s``), wait for the writes. Later calls do nothing."""
        if self._closed:
            return
        root = getattr(cache, "root", None)
        if root is not None:
            deadline = time.monotonic() + time_limit_s
            stats = self.stats
            before = (stats.num_pages_queued, stats.num_states_queued, stats.num_bytes_queued)
            for node in sorted(_cached_nodes(root), key=lambda n: n.last_access):
                if (stats.num_bytes_queued - before[2] >= self.store.budget_bytes
                        or time.monotonic() > deadline):
                    break
                if node.snapshot is not None:  # (first: `evicting` forgets the node's keys)
                    self.evicting_state(node, node.snapshot)
                self.evicting(node, node.blocks)
                self.flush()  # one node at a time: its copy is all that is held
            logger.info("KV disk cache: %d cached pages and %d recurrent states saved at "
                        "shutdown", stats.num_pages_queued - before[0],
                        stats.num_states_queued - before[1])
        self._closed = True
        self.flush()
        self._writer.shutdown(wait=True)

    # -- the rest ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait for every queued write."""
        with self._lock:
            futures, self._futures = self._futures, []
        for f in futures:
            f.result()

    def _has(self, key: bytes) -> bool:
        with self._lock:
            queued = key in self._pending
        if queued:
            self.flush()
        return self.store.contains(key)

    def _save(self, keys: list[bytes], ids: list[int], row_bytes: int,
              copy_out: Callable[[list[int]], np.ndarray]) -> int:
        """Queue the write of ``keys``' rows that the disk does not hold: ``copy_out(ids)``,
        ``[len(ids), row_bytes]`` (pages, or one state slot) copied now; return how many."""
        with self._lock:
            todo = [(k, b) for k, b in zip(keys, ids)
                    if k not in self._pending and not self.store.contains(k)]
            size = len(todo) * row_bytes
            if not todo:
                return 0
            if self._pending_bytes + size > self.max_pending_bytes:
                self.stats.num_pages_dropped += len(todo)
                return 0
            self._pending.update(k for k, _ in todo)
            self._pending_bytes += size
        data = copy_out([b for _, b in todo])
        self.stats.num_bytes_queued += size
        future = self._writer.submit(self._write, [k for k, _ in todo], data, size)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
        return len(todo)

    def _write(self, keys: list[bytes], rows: np.ndarray, size: int) -> None:
        """On the writer thread."""
        try:
            for i, key in enumerate(keys):
                self.store.put(key, memoryview(rows[i]))
        except Exception:  # a lost page is only recomputed later
            logger.exception("KV disk cache: writing %d pages failed", len(keys))
        finally:
            with self._lock:
                self._pending.difference_update(keys)
                self._pending_bytes -= size


class NodeKeys:
    """The page keys of radix nodes, kept per node so that evicting a deep node's tail, a
    page a decode step, hashes only its new pages, not its whole path (1 us a page: 2 ms for
    a 30k-token path, per eviction).

    NOTE: a node's keys end at its ``end``, which a split never moves (the deeper half keeps
    the node) and eviction only lowers (the node's tail pages go), so the keys kept for a
    node stay right from its end backwards; those past a lowered end are dropped."""

    MAX_NODES = 100_000  # past it everything is forgotten (nodes a reset dropped linger)

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._keys: dict[int, tuple[int, list[bytes]]] = {}  # uid -> (end, keys up to end)

    def of(self, node: RadixNode) -> list[bytes]:
        """The keys of ``node``'s own pages (its key's), in order."""
        bs = self.block_size
        chain = []  # the nodes up to the first whose keys are known (or the root)
        n = node
        while n.parent is not None and self._known(n) is None:
            chain.append(n)
            n = n.parent
        prev = ROOT_HASH if n.parent is None else self._known(n)[-1]
        for n in reversed(chain):
            keys = chain_hashes(prev, n.key, bs)
            self._keep(n, keys)
            prev = keys[-1]
        return self._known(node)[-(len(node.key) // bs):]

    def forget(self, node: RadixNode) -> None:
        self._keys.pop(node.uid, None)

    def _known(self, node: RadixNode) -> list[bytes] | None:
        """Keys ending at ``node.end``, covering at least its own pages; None if unknown."""
        entry = self._keys.get(node.uid)
        if entry is None:
            return None
        end, keys = entry
        if end != node.end:  # its tail was evicted
            cut = (end - node.end) // self.block_size
            if cut > len(keys):
                return None
            keys = keys[:len(keys) - cut]
            self._keys[node.uid] = (node.end, keys)
        return keys if len(keys) * self.block_size >= len(node.key) else None

    def _keep(self, node: RadixNode, keys: list[bytes]) -> None:
        if len(self._keys) >= self.MAX_NODES:
            self._keys.clear()
        self._keys[node.uid] = (node.end, keys)


def _cached_nodes(root: RadixNode) -> Iterator[RadixNode]:
    return (node for node in iter_nodes(root) if node.blocks)
