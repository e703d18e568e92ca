"""`StructuredBackend` over llguidance: JSON schema, regex, choice and Lark/GBNF grammars.

llguidance (Rust) builds its lexer lazily against the vocabulary, so a compile is about a
millisecond, and computes masks with the GIL released. Its tokenizer view is built once
(structured/llguidance_tokenizer.py: about 0.4 CPU s for a 152k vocabulary), on the first
compile or the start's warm-up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import llguidance
import llguidance.numpy as llg_numpy  # not llguidance.torch: its torch.compile'd
import torch  # kernel imports dynamo and inductor at load (1.5 s of the engine's start)

from radixserve.tokenizer.tokenizer import Tokenizer
from radixserve.structured.backend import GrammarError
from radixserve.structured.llguidance_probe import (
    LIMIT_STOP_REASONS,
    compile_and_probe,
    limit_message,
)
from radixserve.structured.llguidance_spec import grammar_text, validate_spec
from radixserve.structured.llguidance_tokenizer import ll_tokenizer
from radixserve.structured.params import GrammarSpec


class LLGuidanceMatcher:
    __slots__ = ("_matcher", "_kind")

    def __init__(self, matcher: llguidance.LLMatcher, kind: str = "grammar") -> None:
        self._matcher = matcher
        self._kind = kind

    def accept_token(self, token_id: int) -> bool:
        # NOTE: a matcher that failed (a limit hit while computing its mask) allows only eos
        # in that mask and would accept it as the grammar's end: a "stop" whose text the
        # grammar does not match
        return not self._matcher.is_error() and self._matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise RuntimeError(f"grammar rollback of {num_tokens} tokens failed: "
                               f"{self._matcher.get_error()}")

    def valid_prefix(self, token_ids: list[int]) -> int:
        return self._matcher.validate_tokens(token_ids) if token_ids else 0

    def forced_tokens(self) -> list[int]:
        return self._matcher.compute_ff_tokens()

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def error(self) -> str | None:
        """Why the matcher failed: a limit it hit (a grammar too complex) computing a mask or
        accepting a token, else None (none hit, or the last token was not allowed)."""
        if not self._matcher.is_error():
            return None
        if self._matcher.stop_reason() in LIMIT_STOP_REASONS or "too many" in (
                self._matcher.get_error()):
            return limit_message(self._kind, self._matcher)
        return None


class LLGuidanceGrammar:
    """A compiled grammar: a pristine matcher that each request deep-copies."""

    def __init__(self, matcher: llguidance.LLMatcher, kind: str = "grammar") -> None:
        self._pristine = matcher
        self._kind = kind

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._pristine.deep_copy(), self._kind)


class LLGuidanceBackend:
    """``tokenizer``: a callable returning the radixserve `Tokenizer` (called once, on the
    first compile; its eos ids are allowed exactly where a grammar may end); ``vocab_size``:
    the logits' width (ids past the tokenizer's vocabulary are never allowed).
    """

    def __init__(self, tokenizer: Callable[[], Tokenizer], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._load_tokenizer = tokenizer
        self._lltok: llguidance.LLTokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int) -> LLGuidanceBackend:
        """From a loaded radixserve `Tokenizer`."""
        return cls(lambda: tokenizer, vocab_size)

    def validate(self, spec: GrammarSpec) -> None:
        validate_spec(spec)

    def compile(self, spec: GrammarSpec) -> LLGuidanceGrammar:
        """Compile and walk the first tokens (`compile_and_probe`): a grammar beyond the
        matcher's limits fails here, before its request starts."""
        tokenizer = self._tokenizer()
        matcher = compile_and_probe(tokenizer, grammar_text(spec), spec.kind, self._eos_ids)
        return LLGuidanceGrammar(matcher, spec.kind)

    def token_bytes(self) -> list[bytes | None]:
        tokenizer = self._tokenizer()
        return [None if tokenizer.is_special_token(t) else tokenizer.decode_bytes([t])
                for t in range(tokenizer.vocab_size)]

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return torch.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    def fill_bitmask(self, matchers: Sequence[LLGuidanceMatcher], bitmask: torch.Tensor) -> None:
        # NOTE: one row after another on this (mask) thread, not llguidance's parallel fill:
        # its worker threads fought the forward's OpenMP threads for the 2 cores (-18 %
        # throughput at 32 constrained rows, against -8 % this way; benchmarks/bench_structured.py).
        rows = bitmask.numpy()  # the same memory (a CPU tensor)
        for i, m in enumerate(matchers):
            llg_numpy.fill_next_token_bitmask(m._matcher, rows, i)

    def _tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltok is None:
                tokenizer = self._load_tokenizer()
                self._eos_ids = frozenset(tokenizer.eos_token_ids)
                self._lltok = ll_tokenizer(tokenizer, self.vocab_size)
                self._load_tokenizer = None  # what it holds (the engine's GGUF reader) goes
            return self._lltok
