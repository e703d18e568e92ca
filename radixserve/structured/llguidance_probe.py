"""Compiling a grammar against the tokenizer and walking its first tokens, so that a grammar
beyond llguidance's limits is refused before generation, not at some output token.

llguidance builds its lexer and parser state lazily: a grammar can compile and then hit a limit
on the first token it consumes. ``(a{1000}){1000}`` runs out of lexer fuel ("too many expressions
constructed") and a choice of 5,000 alternatives written as grammar rules has a 5,001-item
parser row (the limit is 2,000); in both the first mask is computed, a token it allows is
consumed, and the matcher then fails, which the engine used to report as that token breaking
the grammar. The probe does that walk up front (and warms the lexer, whose states a request's
copy of the matcher shares, so the first real mask is not the slow one on the step loop).
"""

from __future__ import annotations

import threading

import llguidance
import numpy as np

from radixserve.structured.backend import GrammarError
from radixserve.structured.params import GrammarSpec

PROBE_TOKENS = 8  # tokens walked after the compile (each the lowest-id token the mask allows)
# llguidance stop reasons that mean "the matcher hit a limit", not "the token was not allowed"
LIMIT_STOP_REASONS = frozenset({"InternalError", "LexerTooComplex", "ParserTooComplex"})


def limit_message(kind: str, matcher: llguidance.LLMatcher) -> str:
    """The user-facing error of a matcher that failed (first line of llguidance's error)."""
    detail = matcher.get_error().strip().splitlines()[0] if matcher.get_error() else "failed"
    return (f"the {kind} is too complex for the structured output matcher ({detail}); "
            "simplify it")


def compile_and_probe(tokenizer: llguidance.LLTokenizer, text: str, kind: str,
                      eos_token_ids: frozenset[int] = frozenset()) -> llguidance.LLMatcher:
    """A matcher for llguidance grammar ``text`` at its start; GrammarError if the grammar is
    invalid or fails within its first `PROBE_TOKENS` tokens. Releases the GIL while llguidance
    works (the first mask of a large grammar can take a second)."""
    matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"invalid {kind}: {matcher.get_error().strip()}")
    walker = matcher.deep_copy()
    eos = np.fromiter(eos_token_ids, np.int64, len(eos_token_ids))
    for _ in range(PROBE_TOKENS):
        if walker.is_stopped():
            break
        bits = np.unpackbits(np.frombuffer(walker.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")
        if walker.is_error():
            raise GrammarError(limit_message(kind, walker))
        bits[eos[eos < bits.size]] = 0
        token = int(bits.argmax())  # the lowest allowed id (numpy: a mask can allow 100k)
        if not bits[token]:
            break
        if not walker.consume_token(token):
            raise GrammarError(limit_message(kind, walker))
    return matcher


def check_spec(tokenizer: llguidance.LLTokenizer, spec: GrammarSpec) -> None:
    """GrammarError naming the problem if ``spec`` is invalid or beyond the matcher's limits."""
    from radixserve.structured.llguidance_spec import grammar_text

    compile_and_probe(tokenizer, grammar_text(spec), spec.kind)


class SpecChecker:
    """`check_spec` against one tokenizer: the API process's full check of a spec (compile
    and probe, as the engine will), so a grammar beyond the limits is a 400 up front.
    ``tokenizer``: the radixserve `Tokenizer`. The llguidance view of it is built once, on
    ``warm()`` (about 0.4 s, holding the GIL: call it at start-up) or on the first check."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._view: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        with self._lock:
            if self._view is None:
                from radixserve.structured.llguidance_tokenizer import ll_tokenizer

                self._view = ll_tokenizer(self._tokenizer, self._tokenizer.vocab_size)

    def __call__(self, spec: GrammarSpec) -> None:
        self.warm()
        check_spec(self._view, spec)
