"""KVCacheManager: what the scheduler talks to for KV blocks (match, allocate, free)."""

from __future__ import annotations

from radixserve.core.images import with_image_ids
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.disk_hooks import DiskTier, NoDiskTier
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.prefix_cache import PrefixCache
from radixserve.core.kv.recurrent_states import NoRecurrentStates, RecurrentStates, SeqState
from radixserve.core.request import Request

from radixserve.core.kv.kv_events import LORA_KEY_SHIFT  # above every vocabulary


def cache_tokens(request: Request, end: int | None = None) -> list[int]:
    """The token ids the prefix cache indexes for ``request``'s first ``end`` tokens (all by
    default): its own for the base model (its images' rows by ids from their keys); for a LoRA request each offset by ``lora_id <<
    32``, so its KV (computed with the adapter) is shared only with requests of the same
    adapter: the tree never matches a page across adapters (core/kv/kv_events.py reads the
    adapter back from the offset)."""
    tokens = request.all_token_ids if end is None else request.all_token_ids[:end]
    if request.images:  # an image's rows by ids made from its key (core/images.py)
        tokens = with_image_ids(tokens, request.images)
    if request.lora_id is None:
        return tokens
    offset = request.lora_id * LORA_KEY_SHIFT
    return [t + offset for t in tokens]


class KVCacheManager:
    """Maps requests to block tables over a ``BlockPool``, reusing prefixes via a ``PrefixCache``.

    One table per KV group (kv_groups.py): ``request.block_ids`` for the first group,
    ``request.window_block_ids`` for the others (sliding-window groups); each holds
    ``units_per_page`` pool ids per page and every table has the same number of pages. A
    sliding group's pages that fell out of the window are released as the request advances
    (in ``allocate_slots``), their slots then holding the pool's null block.

    A hybrid model's recurrent layers hold a state per request instead (``states``:
    recurrent_states.py): ``allocate_slots`` also gives a new request its state slots (False
    when none is free), ``state_plan`` says what the runner does with them each step, and the
    prefix cache keeps snapshots of them where pages are cached.

    With a disk tier (disk_hooks.py, one full-attention group) a match continues on disk:
    the pages found there get blocks, their rows copied in, and enter the tree as cached; a
    hybrid model's, up to the deepest page whose recurrent state the disk holds.

    NOTE: a request's tables always cover at least its ``num_computed_tokens``; the
    prefix-cache handle of a running request stays locked until ``free``.
    """

    def __init__(self, block_pool: BlockPool, prefix_cache: PrefixCache, block_size: int,
                 groups: KVGroups | None = None,
                 states: RecurrentStates | None = None, disk: DiskTier | None = None) -> None:
        """``groups``: the model's KV groups; default one group of one id a page (no
        release). With a sliding group the pool needs its null block. ``states``: a hybrid
        model's recurrent-state slots (default: none). ``disk``: where matches continue
        (default: nowhere; the prefix cache saves to the same tier)."""
        self.block_pool = block_pool
        self.prefix_cache = prefix_cache
        self.block_size = block_size
        self.groups = groups or KVGroups.single(0)
        self._sliding = [(g, group) for g, group in enumerate(self.groups.groups)
                         if group.is_sliding]
        assert not self._sliding or block_pool.null_block is not None, "needs a null block"
        self._units_per_page = self.groups.units_per_page
        self._m0 = self.groups.groups[0].units_per_page
        self._single = len(self.groups.groups) == 1
        self.states = states or NoRecurrentStates()
        self._hybrid = isinstance(self.states, RecurrentStates)
        self.disk = disk or NoDiskTier()
        self.num_disk_hit_tokens = 0  # of num_hit_tokens, those read back from the disk tier
        self._resume: dict[str, int | None] = {}  # a hit's snapshot slot, until allocation
        self._pinned: dict[str, object] = {}  # a hit's snapshot node, until its first step
        self._handles: dict[str, object] = {}
        self._hit_pages: dict[str, int] = {}  # pages the prefix cache gave each request
        self.num_query_tokens = 0  # prefix-cache lookups, in tokens (metrics)
        self.num_hit_tokens = 0

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests (cached-but-unreferenced blocks count as free:
        they are evicted on demand)."""
        usable = self.num_usable_blocks
        used = usable - self.block_pool.num_free_blocks - self.prefix_cache.num_evictable_blocks
        return used / usable

    def num_blocks_for(self, num_tokens: int) -> int:
        """Pages (of every group) that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def units_held(self, num_tokens: int, max_chunk: int) -> int:
        """The most pool blocks one sequence of ``num_tokens`` holds at once (fed at most
        ``max_chunk`` tokens a step): its sliding groups keep about a window's worth."""
        return self.groups.units_held(num_tokens, self.block_size, max_chunk)

    @property
    def num_usable_blocks(self) -> int:
        """The pool's blocks that requests can hold (all but the null block)."""
        return self.block_pool.num_blocks - (self.block_pool.null_block is not None)

    def num_pages(self, request: Request) -> int:
        return len(request.block_ids) // self._m0

    def tables(self, request: Request) -> list[list[int]]:
        return [request.block_ids, *request.window_block_ids]

    def match_and_lock(self, request: Request) -> int:
        """Attach the longest cached prefix to a request with no blocks; return its tokens.

        At least one token is always left to compute, so the request still samples.
        """
        assert not request.block_ids and request.num_computed_tokens == 0
        match = self.prefix_cache.match_prefix(cache_tokens(request, -1))
        self.num_query_tokens += request.num_tokens
        self.num_hit_tokens += match.num_tokens
        self.prefix_cache.lock(match.handle)
        self._handles[request.request_id] = match.handle
        self._hit_pages[request.request_id] = match.num_tokens // self.block_size
        self._resume[request.request_id] = match.snapshot if match.num_tokens else None
        if match.snapshot is not None and match.num_tokens:  # kept until its copy ran
            self.prefix_cache.pin_snapshot(match.handle, True)
            self._pinned[request.request_id] = match.handle
        request.block_ids = list(match.block_ids)
        if not self._single:
            request.window_block_ids = [list(t) for t in match.window_block_ids]
        for table in self.tables(request):
            self.block_pool.share(self._owned(table))
        if self._hybrid:
            return self._restore_state(request, match)
        return self._restore(request, match.num_tokens)

    def cached_len(self, request: Request) -> int:
        """The prompt tokens ``match_and_lock`` would find cached now (no side effect)."""
        return self.prefix_cache.cached_len(cache_tokens(request))

    def can_fit(self, num_blocks: int) -> bool:
        """True if ``num_blocks`` more blocks can be had, evicting cached blocks if needed."""
        free = self.block_pool.num_free_blocks
        return free + self.prefix_cache.num_evictable_blocks >= num_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's tables to hold ``num_computed_tokens + num_new_tokens`` tokens.

        First releases the sliding groups' pages that no query from ``num_computed_tokens``
        on reads (whatever follows). Evicts from the prefix cache when the pool is short.
        Returns False, allocating nothing, if the blocks (or a new request's state slots)
        cannot be had.

            pages: [ released (null) | in window ... computed | new ........ ]
                                      ^ first_needed_page(num_computed_tokens)
        """
        if not self.states.has(request.request_id):
            if not self.states.acquire(request.request_id,
                                       self._resume.pop(request.request_id, None)):
                return False
        if self._sliding:
            if not request.window_block_ids and not self._single:
                request.window_block_ids = [[] for _ in self.groups.groups[1:]]
            self._release_out_of_window(request)
        total = request.num_computed_tokens + num_new_tokens
        pages = -(-total // self.block_size) - len(request.block_ids) // self._m0
        if pages <= 0:
            return True
        need = pages * self._units_per_page
        if not self.can_fit(need):
            return False
        short = need - self.block_pool.num_free_blocks
        if short > 0:
            self.prefix_cache.evict(short)
        if self._single:
            request.block_ids.extend(self.block_pool.allocate(need))
            return True
        for group, table in zip(self.groups.groups, self.tables(request)):
            table.extend(self.block_pool.allocate(pages * group.units_per_page))
        return True

    def trim(self, request: Request) -> None:
        """Return the blocks past the request's tokens (a rejected draft's lookahead slots;
        owned by the request alone: nothing indexes tokens that were never computed)."""
        keep = self.num_blocks_for(request.num_tokens)
        for group, table in zip(self.groups.groups, self.tables(request)):
            cut = keep * group.units_per_page
            if len(table) > cut:
                self.block_pool.free(table[cut:])
                del table[cut:]

    def cache_computed(self, request: Request) -> None:
        """Make the request's computed full pages findable by other requests now (after a
        prefill chunk, or when decoding fills a block), not only when it finishes."""
        self._unpin(request)  # its first step (the snapshot's copy) ran
        computed = cache_tokens(request, request.num_computed_tokens)
        handle = self.prefix_cache.cache_blocks(computed, request.block_ids,
                                                request.window_block_ids)
        self.prefix_cache.lock(handle)
        self.prefix_cache.unlock(self._handles.get(request.request_id))
        self._handles[request.request_id] = handle
        if request.num_computed_tokens <= request.num_prompt_tokens:  # a prefill chunk's end
            self.states.keep(request.request_id, handle, self._page_end(request))

    def add_draft(self, request: Request, state: SeqState | None, k: int) -> bool:
        """A hybrid model's recurrent states for ``k`` drafted tokens on this step's chunk
        (``state``: its plan); False when they cannot be had (then no draft). Always True
        for a model without recurrent layers."""
        return self.states.add_draft(request.request_id, state, k)

    def draft_applied(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        """Verification kept ``num_accepted`` of the request's ``num_drafted`` drafts."""
        self.states.draft_applied(request.request_id, num_drafted, num_accepted)

    def state_plan(self, request: Request, num_new: int) -> SeqState | None:
        """What the runner does with the request's recurrent state this step, feeding
        ``num_new`` tokens from ``num_computed_tokens`` (None: no recurrent layers)."""
        return self.states.plan(request.request_id, request.num_computed_tokens, num_new,
                                request.num_prompt_tokens)

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (its computed prefix may stay cached)."""
        handle = self._handles.pop(request.request_id, None)
        self._hit_pages.pop(request.request_id, None)
        self._resume.pop(request.request_id, None)
        self._unpin(request)
        computed = cache_tokens(request, request.num_computed_tokens)
        node = self.prefix_cache.release(computed, request.block_ids, handle,
                                         request.window_block_ids)
        end = self._page_end(request)
        self.states.release(request.request_id, node, end, request.num_computed_tokens == end)
        request.block_ids = []
        request.window_block_ids = []

    def check_integrity(self) -> None:
        self.block_pool.check_integrity()
        self.prefix_cache.check_integrity()
        if isinstance(self.states, RecurrentStates):
            snapshots = getattr(self.prefix_cache, "snapshots", None)
            self.states.pool.check_integrity(self.states.num_held
                                             + (snapshots.count if snapshots else 0))

    def check_request(self, request: Request) -> None:
        """Assert the request's tables: same pages in every group, enough for its computed
        tokens, nothing released that a query from ``num_computed_tokens`` on still reads."""
        null = self.block_pool.null_block
        pages = self.num_pages(request)
        assert pages >= self.num_blocks_for(request.num_computed_tokens)
        assert len(request.window_block_ids) in (0, len(self.groups.groups) - 1)
        for group, table in zip(self.groups.groups, self.tables(request)):
            m = group.units_per_page
            assert len(table) == pages * m, "tables of different lengths"
            first = group.first_needed_page(request.num_computed_tokens, self.block_size)
            for k in range(first, pages):
                assert null not in table[k * m:(k + 1) * m], f"page {k} needed but released"
            for b in table:
                assert b == null or self.block_pool.ref_counts[b] >= 1, f"block {b} is free"

    # -- internals -------------------------------------------------------------------------

    def _release_out_of_window(self, request: Request) -> None:
        """Free each sliding group's pages before its window (from the last released one
        back to the first still held: released pages are always a prefix of the table).

        The prefix cache is told to forget the pages the request computed itself (never
        those its hit gave it: the cache kept them for other requests' sake)."""
        null, bs = self.block_pool.null_block, self.block_size
        tables = self.tables(request)
        for g, group in self._sliding:
            table, m = tables[g], group.units_per_page
            first = min(group.first_needed_page(request.num_computed_tokens, bs),
                        len(table) // m)
            k = first
            while k > 0 and table[(k - 1) * m] != null:
                k -= 1
            if k == first:
                continue
            released = table[k * m:first * m]
            self.block_pool.free(released)
            table[k * m:first * m] = [null] * ((first - k) * m)
            own = max(k, self._hit_pages.get(request.request_id, 0))
            if own < first:
                self.prefix_cache.forget(self._handles.get(request.request_id), g, own,
                                         released[(own - k) * m:],
                                         (request.num_prompt_tokens - 1) // bs)

    def _restore(self, request: Request, num_cached: int) -> int:
        """Continue a locked match of ``num_cached`` tokens with the pages the disk tier
        holds (as many as the pool can give blocks to); return the tokens now cached.

            pages: [ matched in the tree | found on disk ... | not found, computed ]
                                         ^ num_cached // block_size
        """
        tokens = cache_tokens(request, -1)
        pages = self.disk.lookup(tokens, num_cached // self.block_size)
        num = min(len(pages), self.block_pool.num_free_blocks
                  + self.prefix_cache.num_evictable_blocks)
        if num <= 0:
            return num_cached
        short = num - self.block_pool.num_free_blocks
        if short > 0:
            self.prefix_cache.evict(short)
        blocks = self.block_pool.allocate(num)
        loaded = self.disk.load(pages[:num], blocks)
        self.block_pool.free(blocks[loaded:])
        if not loaded:
            return num_cached
        request.block_ids.extend(blocks[:loaded])  # the request's reference (from allocate)
        end = num_cached + loaded * self.block_size
        handle = self.prefix_cache.cache_blocks(tokens[:end], request.block_ids)
        self.prefix_cache.lock(handle)
        self.prefix_cache.unlock(self._handles[request.request_id])
        self._handles[request.request_id] = handle
        self.num_hit_tokens += end - num_cached
        self.num_disk_hit_tokens += end - num_cached
        return end

    def _restore_state(self, request: Request, match) -> int:
        """A hybrid model's match continued up to the deepest page end ``k`` whose recurrent
        state the disk tier holds, past the usable hit ``lo``: over the pages the tree
        matched without a snapshot (``match.past_block_ids``), then those the disk holds.
        The state goes into a spare slot that the tree keeps as its snapshot at ``k``, and
        the request resumes from it; return the tokens now cached. Nothing changes when no
        state is found, or a page or the state fails to load.

            pages: [ usable hit | the tree's, no snapshot | on the disk ... | computed ]
                                ^ lo                                 ^ k (state on disk)
        """
        bs, rid = self.block_size, request.request_id
        tokens, lo = cache_tokens(request, -1), match.num_tokens // bs
        tree_end = lo + len(match.past_block_ids)
        disk_pages = self.disk.lookup(tokens, tree_end)
        found = self.disk.lookup_state(tokens, lo, tree_end + len(disk_pages))
        if found is None:
            return match.num_tokens
        k, state = found
        num = max(0, k - tree_end)  # pages to read from the disk
        if num > self.block_pool.num_free_blocks + self.prefix_cache.num_evictable_blocks:
            return match.num_tokens
        slot = self.states.spare_slot()
        if slot is None:
            return match.num_tokens
        shared = match.past_block_ids[:k - lo]
        self.block_pool.share(shared)  # (before evicting: the tree's copies are unlocked)
        request.block_ids.extend(shared)
        if num:
            self.prefix_cache.evict(num - self.block_pool.num_free_blocks)
            blocks = self.block_pool.allocate(num)
            request.block_ids.extend(blocks)
        if (num and self.disk.load(disk_pages[:num], request.block_ids[-num:]) < num
                or not self.disk.load_state(state, slot)):
            self.block_pool.free(request.block_ids[lo:])
            del request.block_ids[lo:]
            self.states.pool.free(slot)
            return match.num_tokens
        end = k * bs
        handle = self.prefix_cache.cache_blocks(tokens[:end], request.block_ids)
        self.prefix_cache.lock(handle)
        self.prefix_cache.unlock(self._handles[rid])
        self._handles[rid] = handle
        attached = self.prefix_cache.attach_snapshot(handle, slot, end)
        assert attached, "the tree held a snapshot past the usable hit"
        self._unpin(request)
        self.prefix_cache.pin_snapshot(handle, True)  # kept until its copy ran
        self._pinned[rid], self._resume[rid] = handle, slot
        self.num_hit_tokens += end - match.num_tokens
        self.num_disk_hit_tokens += end - match.num_tokens
        return end

    def close(self) -> None:
        """The engine stops: the disk tier saves what the prefix cache holds."""
        self.disk.close(self.prefix_cache)

    def _unpin(self, request: Request) -> None:
        handle = self._pinned.pop(request.request_id, None)
        if handle is not None:
            self.prefix_cache.pin_snapshot(handle, False)

    def _page_end(self, request: Request) -> int:
        """The computed tokens' last full page boundary (where cached pages end)."""
        return request.num_computed_tokens - request.num_computed_tokens % self.block_size

    def _owned(self, table: list[int]) -> list[int]:
        null = self.block_pool.null_block
        return table if null is None else [b for b in table if b != null]
