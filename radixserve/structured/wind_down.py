"""Closing a JSON answer before its token budget runs out.

A small model under a JSON schema most often fails by never closing: an array that gains item
after item, a string or a number that never ends, until ``max_tokens`` cuts the answer as
invalid JSON. So near the end of its budget a JSON-constrained request is steered to close:

    narrowing: the allowed tokens become the first non-empty one of
      1. the allowed tokens that only close: their text, whitespace aside, is made of ``"``,
         ``]`` and ``}`` (end the string, the array, the object);
      2. the allowed tokens that only move the structure on: made of those and ``,`` / ``:``
         (the next required member, whose value rule 1 then closes);
    and stay as the grammar has them when neither has an allowed token (a number's first
    digit, a forced key).

    when: once the tokens left (counting the one being chosen) are at most the closing cost
    plus 8, or a sixth of ``max_tokens`` (at most 64: a value the walk cannot end, like a
    date-time's fraction digits, still gets that much room to close). The closing cost is what narrowing itself needs to finish the answer from the
    current state: measured by walking the grammar with narrowing's own choices (the first
    allowed token of the narrowed set, stopping where the grammar may end), then rolled
    back; measured within the last 256 tokens of the budget, again after half the distance
    between the tokens left and the cost (at least 8 tokens), and never again once it
    exceeds the tokens left (a walk stops there).

The grammar's mask is only ever narrowed, so the answer stays valid; a request that closes on
its own before then is untouched; everything depends on the request's own budget and output,
so greedy output stays the same in any batch, with or without a draft.
`NO_WIND_DOWN` is the null object (constraints other than JSON).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

_CLOSING = frozenset(b'"]}')
_STRUCTURAL = frozenset(b'"]},:')
_SPACE = frozenset(b" \t\r\n")


MARGIN = 8
EVERY = 8
LOOKAHEAD = 256


class WindDown:
    """The rule above for one vocabulary; ``token_bytes()`` gives each token id's bytes (None
    for special tokens), read once, on first use. ``fill(matcher, row)`` writes a matcher's
    allowed tokens into a one-row bitmask."""

    def __init__(self, token_bytes: Callable[[], list[bytes | None]], vocab_size: int,
                 fill: Callable[[Any, torch.Tensor], None]) -> None:
        self._token_bytes = token_bytes
        self._words = (vocab_size + 31) // 32
        self._fill = fill
        self._masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Build the token classes now (reads ``token_bytes()``) rather than on first use."""
        self._class_masks()

    def applies(self, tokens_left: int, closing_cost: int, max_tokens: int) -> bool:
        return tokens_left <= max(closing_cost + MARGIN, min(64, max_tokens // 6))

    def closing_cost(self, matcher, limit: int = LOOKAHEAD) -> int:
        """Tokens narrowing needs to finish the answer from ``matcher``'s state (``limit`` + 1:
        more than ``limit``). The matcher is advanced and rolled back (its owner must not use
        it meanwhile)."""
        stop = self._class_masks()[2]
        row = torch.empty(1, self._words, dtype=torch.int32)
        words = row[0].numpy()  # the same memory: numpy's small ops cost less than torch's
        steps = 0
        try:
            while steps <= limit:
                self._fill(matcher, row)
                if np.bitwise_and(words, stop).any():
                    return steps
                self._narrow(words)
                token = _first_allowed(words)
                if token is None or not matcher.accept_token(token):
                    return limit + 1
                steps += 1
            return limit + 1
        finally:
            matcher.rollback(steps)

    def narrow(self, row: torch.Tensor) -> None:
        """Narrow one bitmask row (int32 words, on the CPU) in place, by the rule."""
        self._narrow(row.numpy())

    def _narrow(self, words: np.ndarray) -> None:
        for mask in self._class_masks()[:2]:
            both = np.bitwise_and(words, mask)
            if both.any():
                words[:] = both
                return

    def _class_masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            if self._masks is None:
                self._masks = self._build()
            return self._masks

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(closing, structural, special) token masks; a special token allowed by a JSON
        grammar is where the answer may end."""
        closing = np.zeros(self._words * 32, dtype=bool)
        structural = np.zeros(self._words * 32, dtype=bool)
        special = np.zeros(self._words * 32, dtype=bool)
        for token, text in enumerate(self._token_bytes()[:self._words * 32]):
            if text is None:
                special[token] = True
                continue
            chars = set(text) - _SPACE
            if chars and chars <= _CLOSING:
                closing[token] = True
            if chars and chars <= _STRUCTURAL:
                structural[token] = True
        return _pack(closing), _pack(structural), _pack(special)


def _first_allowed(words: np.ndarray) -> int | None:
    nonzero = np.flatnonzero(words)
    if not nonzero.size:
        return None
    index = int(nonzero[0])
    word = int(words[index]) & 0xFFFFFFFF
    return index * 32 + ((word & -word).bit_length() - 1)


def _pack(allowed: np.ndarray) -> np.ndarray:
    """A bool vector as int32 bitmask words (bit ``t % 32`` of word ``t // 32``)."""
    return np.packbits(allowed.reshape(-1, 32), axis=1, bitorder="little").view(
        np.int32).reshape(-1)


class _NoWindDown:
    def warm(self) -> None:
        """Build the token classes now (reads ``token_bytes()``) rather than on first use."""
        self._class_masks()

    def applies(self, tokens_left: int, closing_cost: int, max_tokens: int) -> bool:
        return False

    def closing_cost(self, matcher, limit: int = LOOKAHEAD) -> int:
        return limit + 1

    def narrow(self, row: torch.Tensor) -> None:
        pass


NO_WIND_DOWN = _NoWindDown()
