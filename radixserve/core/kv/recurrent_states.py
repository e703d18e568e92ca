"""Which recurrent-state slots each request uses, step by step (hybrid models).

A running request of a hybrid model holds a *live* slot (its state as of its computed tokens)
and, with the prefix cache on, a *boundary* slot: the runner copies the live state there at
the last page boundary each step crosses, so the request always has its state at its last full
page at hand. The KV manager gives that copy to the radix tree (core/kv/radix_snapshots.py):

- after each prefill chunk (the pages it cached end there): a later prompt sharing that prefix
  — the same system prompt, the same document — resumes there. The chunk that ends the prompt
  copies at the last page boundary *before* the prompt's last token, so the same prompt sent
  again (a retry, n samples, an evaluator's shared context) finds it: a hit always leaves a
  token to compute;
- when the request ends (finished, aborted or preempted): the next turn of a chat, whose prompt
  is this prompt plus this answer, resumes after the answer's last full page.

The boundary slot then changes hands and the request takes a fresh one. A decode step that
fills a page copies the state (the cost of one state, e.g. ~50 MB for a 4B Qwen3.5, per page of
16 tokens) but keeps it private: only the last one matters at the end.

Every step the runner applies `SeqState`: zero the live slot (a fresh sequence), or copy a
snapshot into it (a prefix hit), or leave it; then the forward carries it on, and where
``snapshot`` says so the kernels write the state at that point of the chunk to another slot.

Speculative decoding: a verify step feeds the last token and k drafted ones, and the live
state comes out after all of them. The request's *draft slots* (taken as drafts need them,
kept while it runs) get the state after the real token and after each of the first k - 1
drafts (``SeqState.drafts``); when verification keeps a < k drafts, the next step starts by
copying the one after a drafts into the live slot (``draft_applied``), so rejected tokens
never reach the state.
Torch-free; the null object `NoRecurrentStates` serves attention-only models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.core.kv.state_pool import StatePool

ZERO = -1  # SeqState.init: start from the zero state


@dataclass(slots=True)
class SeqState:
    """One sequence's recurrent state in one step (plain data for the runner). ``slot`` holds
    it; before the forward it is zeroed (``init == ZERO``), overwritten with slot ``init``'s
    (a prefix hit's snapshot) or left as it is (None). ``snapshot``: ``(n, dst)``: after the
    forward, slot ``dst`` holds the state after the first ``n`` tokens of this chunk.
    ``drafts``: on a verify step, the slots that get the state after the chunk's first 1, 2,
    ... tokens (one fewer than it has: the last one is the live state)."""

    slot: int
    init: int | None = None
    snapshot: tuple[int, int] | None = None
    drafts: tuple[int, ...] = ()


@dataclass(slots=True)
class _Slots:
    live: int
    boundary: int | None
    init: int | None
    boundary_end: int = -1  # the tokens the boundary slot's state follows (-1: none yet)
    live_end: int = -1  # the tokens the live state follows once its planned step ran
    draft_slots: list[int] = field(default_factory=list)  # the state after each draft token


class NoRecurrentStates:
    """Attention-only models: no state, nothing to do."""

    num_held = 0

    def acquire(self, request_id: str, resume: int | None) -> bool:
        return True

    def has(self, request_id: str) -> bool:
        return True

    def plan(self, request_id: str, start: int, num_new: int,
             num_prompt: int) -> SeqState | None:
        return None

    def keep(self, request_id: str, handle, end: int) -> None:
        pass

    def add_draft(self, request_id: str, state: SeqState | None, k: int) -> bool:
        return True

    def draft_applied(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, request_id: str, handle, end: int, live_at_end: bool) -> None:
        pass


class RecurrentStates:
    """Live and boundary slots of running requests over a `StatePool` shared with the prefix
    cache's snapshots (``cache``: its ``attach_snapshot`` / ``evict_snapshot``)."""

    def __init__(self, pool: StatePool, cache, block_size: int, snapshots: bool) -> None:
        """``snapshots``: keep boundary copies for the prefix cache (off without one)."""
        self.pool = pool
        self.cache = cache
        self.block_size = block_size
        self.snapshots = snapshots
        self._slots: dict[str, _Slots] = {}

    @property
    def num_held(self) -> int:
        """Slots the running requests hold (the cache's snapshots aside)."""
        return sum(1 + (s.boundary is not None) + len(s.draft_slots)
                   for s in self._slots.values())

    def has(self, request_id: str) -> bool:
        return request_id in self._slots

    def acquire(self, request_id: str, resume: int | None) -> bool:
        """Give a request its live slot, to start from zero or from snapshot slot ``resume``
        (a prefix hit, which its lock keeps alive until the copy), and a boundary slot if
        one can be had. False, holding nothing, when no live slot is free even after
        evicting the cache's unlocked snapshots."""
        assert request_id not in self._slots
        live = self._allocate(evict=True)
        if live is None:
            return False
        boundary = self._allocate(evict=True) if self.snapshots else None
        self._slots[request_id] = _Slots(live, boundary, ZERO if resume is None else resume)
        return True

    def plan(self, request_id: str, start: int, num_new: int, num_prompt: int) -> SeqState:
        """The step's `SeqState` for tokens ``start .. start + num_new`` of a request with
        ``num_prompt`` prompt tokens: the pending start (once), and a copy at the last page
        boundary the chunk crosses (the one before the prompt's last token in the chunk that
        ends the prompt), if any."""
        held = self._slots[request_id]
        if held.boundary is None and self.snapshots:  # lost to a full pool: try again
            held.boundary = self._allocate(evict=True)
        state = SeqState(held.live, held.init)
        held.init = None
        held.live_end = start + num_new
        stop = start + num_new
        if start < num_prompt <= stop:
            stop = num_prompt - 1
        end = stop // self.block_size * self.block_size
        if held.boundary is not None and end > start:
            state.snapshot = (end - start, held.boundary)
            held.boundary_end = end
        return state

    def keep(self, request_id: str, handle, end: int) -> None:
        """The request's computed pages up to ``end`` are cached under ``handle``: give the
        tree the boundary copy (then take a new one) if it is the state at one of them."""
        held = self._slots.get(request_id)
        if held is None or held.boundary is None or not 0 < held.boundary_end <= end:
            return
        if self.cache.attach_snapshot(handle, held.boundary, held.boundary_end):
            # the least recently used snapshot makes room: a chat keeps its latest turns
            held.boundary, held.boundary_end = self._allocate(evict=True), -1

    def add_draft(self, request_id: str, state: SeqState, k: int) -> bool:
        """Let this step's chunk (``state``, planned) carry ``k`` drafted tokens: the request
        takes draft slots up to ``k`` (never evicting a snapshot for them); False when the
        pool has too few (then it does not draft this step; the slots it got stay its own)."""
        held = self._slots[request_id]
        while len(held.draft_slots) < k:
            slot = self._allocate(evict=False)
            if slot is None:
                return False
            held.draft_slots.append(slot)
        state.drafts = tuple(held.draft_slots[:k])
        return True

    def draft_applied(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """Verification kept ``num_accepted`` of ``num_drafted`` drafts: unless it kept all,
        the next step starts from the state after the real token and those drafts."""
        held = self._slots[request_id]
        if num_accepted < num_drafted:
            held.init = held.draft_slots[num_accepted]
            held.live_end = -1  # the live slot is past the kept tokens until then
        else:
            held.live_end += num_drafted

    def release(self, request_id: str, handle, end: int, live_at_end: bool) -> None:
        """The request is done (``handle``: the node of its cached pages, ending at ``end``;
        ``live_at_end``: its computed tokens end there, so its live state — if its last
        planned step ran — is the state at ``end``): the latest of the two goes to the tree
        where it fits, every other slot back to the pool."""
        held = self._slots.pop(request_id, None)
        if held is None:
            return
        live, boundary = held.live, held.boundary
        if handle is not None and end > 0 and self.snapshots:
            if live_at_end and held.live_end == end and held.boundary_end != end:
                if self.cache.attach_snapshot(handle, live, end):
                    live = None
            elif (boundary is not None and 0 < held.boundary_end <= end
                  and self.cache.attach_snapshot(handle, boundary, held.boundary_end)):
                boundary = None
        for slot in (live, boundary, *held.draft_slots):
            if slot is not None:
                self.pool.free(slot)

    def spare_slot(self) -> int | None:
        """A slot for a snapshot read back from the disk tier (the caller hands it to the
        cache or frees it), evicting the cache's unpinned snapshots if none is free; None
        if none can be had."""
        return self._allocate(evict=True)

    def _allocate(self, evict: bool) -> int | None:
        slot = self.pool.allocate()
        while slot is None and evict and self.cache.evict_snapshot():
            slot = self.pool.allocate()
        return slot
