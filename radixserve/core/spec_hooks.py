"""How speculative decoding plugs into the scheduler: the interface spec/ implements
(spec/drafter.py: `SpecDecoding`) and its null object for "off". Core never imports spec/.

Each step the scheduler first hands out its budget to real work, then lets ``add_drafts``
extend the decoding sequences with drafted tokens out of what is left; after the step it
applies what verification kept (`DraftResult`) and tells the hooks with ``record``.
"""

from __future__ import annotations

from typing import Any, Protocol

from radixserve.core.sched_output import DraftResult, ModelRunnerOutput, ScheduledSeq


class SpecHooks(Protocol):
    """Called by the scheduler (and the engine's ``observe_step``) on its own thread. The
    ``num_*`` and ``*_per_pos`` counters are read for `SchedulerStats`."""

    enabled: bool
    num_drafts: int  # verified drafts, their tokens, the accepted ones
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int]  # drafts whose i-th token was accepted
    drafted_per_pos: list[int]  # drafts that had an i-th token

    def new_state(self) -> Any:
        """The per-request state a newly added request carries (``Request.spec``); only the
        hooks read it."""

    def add_drafts(self, seqs: list[ScheduledSeq], requests: dict, budget: int, kv,
                   max_model_len: int) -> int:
        """Extend decoding ``seqs`` with drafts (``num_draft``) within ``budget`` tokens, their
        KV slots taken from ``kv`` (a `KVCacheManager`) without preempting anything; mutates
        the seqs and the requests' states. Returns the tokens added."""

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """The runner took ``seconds`` for the step of ``num_tokens`` just scheduled."""

    def record(self, request, result: DraftResult) -> None:
        """``request``'s draft was verified and applied."""

    def on_finished(self, request) -> None:
        """``request`` finished or was aborted (before its blocks are freed)."""

    def on_preempted(self, request) -> None:
        """``request``'s KV was dropped; it will be recomputed."""

    def after_step(self, result: ModelRunnerOutput, requests: dict) -> None:
        """The step's output, after the scheduler applied it to the live ``requests``."""

    def check_integrity(self, requests: dict) -> None:
        """Assert the hooks' own invariants against the live ``requests``."""


class NoSpecState:
    """A request's speculation state while speculation is off: nothing to keep."""

    __slots__ = ()


NO_SPEC_STATE = NoSpecState()


class NoSpec:
    """Null object: speculation off."""

    enabled = False
    num_drafts = num_draft_tokens = num_accepted_tokens = 0
    accepted_per_pos: list[int] = []
    drafted_per_pos: list[int] = []

    def new_state(self) -> NoSpecState:
        return NO_SPEC_STATE

    def add_drafts(self, seqs, requests, budget, kv, max_model_len) -> int:
        return 0

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        pass

    def record(self, request, result: DraftResult) -> None:
        pass

    def on_finished(self, request) -> None:
        pass

    def on_preempted(self, request) -> None:
        pass

    def after_step(self, result, requests: dict) -> None:
        pass

    def check_integrity(self, requests: dict) -> None:
        pass


NO_SPEC = NoSpec()
