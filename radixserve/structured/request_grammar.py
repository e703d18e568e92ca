"""One request's constraint state inside the engine core (plain Python, no torch).

A constrained request carries a `RequestGrammar`: it waits for its compile (the scheduler does
not start it before ``is_ready``), then follows the output token by token. With a reasoning end
marker the constraint starts only after the marker appears in the output. It implements
core/grammar_hooks.py's `Grammar`; unconstrained requests carry that module's `NO_GRAMMAR`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from radixserve.structured.backend import CompiledGrammar, GrammarMatcher

logger = logging.getLogger(__name__)


class RequestGrammar:
    """``compiled``: the (shared, maybe still running) compile; ``reasoning_end``: token ids
    after which the constraint starts (empty: from the first output token); ``fast_forward``:
    hand out the tokens the grammar forces; ``overrun``: while the compile runs, why it must
    be given up on (its time limit spent: structured/cpu_budget.py), or None; ``on_limit``:
    told (with the user-facing reason) when the matcher hits one of its limits mid-output,
    so that the spec's later requests are refused up front."""

    def __init__(self, compiled: Future[CompiledGrammar], reasoning_end: tuple[int, ...] = (),
                 fast_forward: bool = True,
                 overrun: Callable[[], str | None] = lambda: None,
                 on_limit: Callable[[str], None] = lambda why: None) -> None:
        self._compiled = compiled
        self._reasoning_end = reasoning_end
        self._in_reasoning = bool(reasoning_end)
        self._fast_forward = fast_forward
        self._overrun = overrun
        self._on_limit = on_limit
        self._failure: str | None = None
        self.matcher: GrammarMatcher | None = None

    @property
    def pending_compile(self) -> Future[CompiledGrammar] | None:
        """The compile this request waits for, or None once it is done."""
        return None if self._compiled.done() else self._compiled

    @property
    def is_ready(self) -> bool:
        """Compiled and usable (creates the request's matcher on the first True)."""
        if self.matcher is None:
            if not self._compiled.done() or self._compiled.exception() is not None:
                return False
            self.matcher = self._compiled.result().new_matcher()
        return True

    @property
    def error(self) -> str | None:
        """Why this request can never start: the compile failed or overran its deadline."""
        if self._compiled.done():
            exc = self._compiled.exception()
            return None if exc is None else str(exc)
        return self._overrun()

    @property
    def is_active(self) -> bool:
        """The next sampled token must be masked by this grammar."""
        return (self.matcher is not None and not self._in_reasoning
                and self._failure is None and not self.matcher.is_terminated)

    @property
    def is_terminated(self) -> bool:
        """The output is complete in its grammar (never after a failure)."""
        return (self.matcher is not None and not self._in_reasoning
                and self._failure is None and self.matcher.is_terminated)

    def fail(self, why: str) -> None:
        """The grammar failed outside ``accept``: computing the step's mask (on the mask
        thread, while the engine thread waits for that mask) or checking a draft. It masks
        no more rows and the next ``accept`` ends the request."""
        self._failure = why

    def accept(self, token_id: int, output_token_ids: list[int]) -> str | None:
        """Advance by ``token_id``, already appended to ``output_token_ids``; None, or why the
        request must end: the matcher hit one of its limits (computing the mask or here),
        the grammar failed computing the mask (`fail`), or (never, if the mask was applied)
        the token is not in the grammar."""
        assert self.matcher is not None, "a request starts only once its grammar is ready"
        if self._in_reasoning:
            end = self._reasoning_end
            if len(output_token_ids) >= len(end) and tuple(output_token_ids[-len(end):]) == end:
                self._in_reasoning = False
            return None
        if self._failure is None and self.matcher.accept_token(token_id):
            return None
        if (limit := self.matcher.error) is not None:
            self._on_limit(limit)
            return limit
        return (self._failure
                or f"token {token_id} broke the request's structured output grammar")

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (fast-forward), or [] when that is off."""
        if not self._fast_forward or not self.is_active:
            return []
        return self.matcher.forced_tokens()

    @property
    def can_draft(self) -> bool:
        """Speculation may draft for it: constrained now (not in its reasoning part, where
        the constraint may start inside a draft)."""
        return self.is_active

    def draftable(self, token_ids: list[int]) -> list[int]:
        """The longest prefix of a draft the grammar accepts and that does not complete it
        (the matcher is left as it was). NOTE: this runs while the step is scheduled, where
        an exception fails every request: a matcher that fails here (one of its limits, hit
        on a token `valid_prefix` passed) drafts nothing and the request ends alone at its
        next token (`fail`)."""
        try:
            return self._draftable(token_ids)
        except Exception as exc:  # noqa: BLE001 - one request's grammar, not the step
            logger.exception("a grammar failed while a draft was checked")
            self.fail(f"the request's structured output grammar failed checking a draft: "
                      f"{type(exc).__name__}: {exc}")
            return []

    def _draftable(self, token_ids: list[int]) -> list[int]:
        n = self.matcher.valid_prefix(token_ids)
        kept = 0
        for t in token_ids[:n]:
            if not self.matcher.accept_token(t):  # a failed matcher cannot roll back
                self.fail(self.matcher.error
                          or f"a checked draft token {t} broke the structured output grammar")
                return []
            kept += 1
            if self.matcher.is_terminated:
                kept -= 1
                self.matcher.rollback(1)
                break
        self.matcher.rollback(kept)
        return token_ids[:kept]

    def rollback(self, num_tokens: int) -> None:
        """Undo accepted tokens (all within the constrained part of the output)."""
        assert self.matcher is not None and not self._in_reasoning
        self.matcher.rollback(num_tokens)
