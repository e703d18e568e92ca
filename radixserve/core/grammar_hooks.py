"""How a request's structured-output constraint plugs into the scheduler: the interface
structured/ implements (structured/request_grammar.py: `RequestGrammar`) and `NO_GRAMMAR`,
which unconstrained requests carry (it accepts everything and never masks). Core never
imports structured/.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol


class Grammar(Protocol):
    """One request's constraint state, read and advanced on the engine's thread only (the
    step's bitmask is filled on another thread while the matcher must not advance)."""

    @property
    def pending_compile(self) -> Future | None:
        """The compile the request waits for; None once done (or for none)."""

    @property
    def is_ready(self) -> bool:
        """Compiled and usable: the scheduler starts the request only then."""

    @property
    def is_active(self) -> bool:
        """The next sampled token must be masked by this grammar."""

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete: the request ends ("stop")."""

    @property
    def error(self) -> str | None:
        """Why the request can never start (its compile failed or overran), else None."""

    matcher: Any  # the backend's matcher (None while not ready), for the step's bitmask

    def accept(self, token_id: int, output_token_ids: list[int]) -> str | None:
        """Advance by ``token_id`` (already appended to ``output_token_ids``); None, or why
        the request must end."""

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next (fast-forward); [] when none or off."""

    @property
    def can_draft(self) -> bool:
        """Speculation may draft for the request now."""

    def draftable(self, token_ids: list[int]) -> list[int]:
        """The longest prefix of a draft the grammar accepts (state left as it was)."""


class NoGrammar:
    """Null object for an unconstrained request."""

    pending_compile = None
    is_ready = True
    is_active = False
    is_terminated = False
    error: str | None = None
    matcher = None

    def accept(self, token_id: int, output_token_ids: list[int]) -> str | None:
        return None

    def forced_tokens(self) -> list[int]:
        return []

    can_draft = True

    def draftable(self, token_ids: list[int]) -> list[int]:
        return token_ids


NO_GRAMMAR = NoGrammar()
