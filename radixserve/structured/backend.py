"""The grammar interface the engine uses, in two levels, whatever library computes the masks.

Engine level (`StructuredBackend`): compile a `GrammarSpec` into a `CompiledGrammar` (slow,
thread-safe, done off the step loop and cached) and fill the rows of one batch bitmask.
Request level (`GrammarMatcher`): the state of one output against its grammar: accept tokens,
roll back N tokens (for speculative decoding), say which tokens are forced next and whether
the grammar has terminated.

A bitmask is an int32 tensor ``[rows, ceil(vocab / 32)]``: bit ``t % 32`` of word ``t // 32``
is set when token ``t`` is allowed (llguidance's and xgrammar's layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

from radixserve.structured.params import GrammarSpec


class GrammarError(ValueError):
    """The spec is invalid (bad schema, regex or grammar, unsupported keyword) or too costly."""


class GrammarMatcher(Protocol):
    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False (and the matcher is then unusable) if the
        grammar does not allow it or the matcher failed before (``error``)."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        ...

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of ``token_ids`` the grammar accepts in a row from here (a speculative
        draft's check); does not advance the matcher."""
        ...

    @property
    def error(self) -> str | None:
        """The limit the matcher hit (a grammar too complex for it, whatever the token),
        computing a mask or in ``accept_token``, as a user-facing sentence; None while it
        hit none (after a failed ``accept_token``: the token itself was not allowed)."""
        ...

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next, whatever the model would say (may be empty).
        Does not advance the matcher."""
        ...

    @property
    def is_terminated(self) -> bool:
        """The output is complete: the grammar accepts no more tokens (never once the
        matcher failed)."""
        ...


class CompiledGrammar(Protocol):
    def new_matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar (cheap; the compiled form is shared)."""
        ...


class StructuredBackend(Protocol):
    vocab_size: int  # the logits' width; the bitmask covers it

    def validate(self, spec: GrammarSpec) -> None:
        """Check a spec without the tokenizer (cheap); GrammarError naming the problem."""
        ...

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile against the tokenizer; GrammarError if invalid. Thread-safe, may be slow."""
        ...

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 bitmask ``[num_rows, ceil(vocab_size / 32)]``."""
        ...

    def token_bytes(self) -> list[bytes | None]:
        """Each token id's bytes (None for special tokens); may be slow, called once."""
        ...

    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor) -> None:
        """Write row i of ``bitmask`` from ``matchers[i]`` (tokens allowed next)."""
        ...
