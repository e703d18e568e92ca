"""Streaming token ids -> text, one decode step at a time.

A byte-level BPE token can hold part of a UTF-8 character, so decoding each token on its own
yields U+FFFD. `IncrementalDetokenizer` keeps two offsets into the token list (the technique
vLLM and TGI use):

* `prefix_offset`: start of a short window of already-emitted tokens, decoded again as context
  (some decoders, e.g. SentencePiece's, render a token differently at the start of a text);
* `read_offset`: end of the text already emitted.

Each step decodes `ids[prefix_offset:read_offset]` and `ids[prefix_offset:]`; the new text is the
difference. While it ends in U+FFFD (an incomplete character), nothing is emitted and the offsets
stay put, so the next token completes the character. Each step costs O(window), not O(output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["IncrementalDetokenizer"]

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5  # prompt tokens decoded as context for the first output tokens


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of output token ids into text deltas for one request.

    Contract: concatenating every `step()` result (then `flush()`) equals
    `tokenizer.decode(output_ids, skip_special_tokens=...)`, and no `step()` result ends in a
    partial UTF-8 character. `tokenizer` is anything with `decode(ids, skip_special_tokens=)`.
    """

    def __init__(
        self,
        tokenizer: _Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = list(prompt_token_ids)
        self._prompt_len = len(self.token_ids)
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(self.read_offset - _PROMPT_CONTEXT, 0)
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._chunks)

    @property
    def output_token_ids(self) -> list[int]:
        """The ids passed to `step()` so far (the prompt excluded)."""
        return self.token_ids[self._prompt_len :]

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Append `new_token_ids`; return the text they complete ("" if it is still partial)."""
        self.token_ids.extend(new_token_ids)
        delta = self._decode_delta(allow_partial=False)
        if delta:
            self._chunks.append(delta)
        return delta

    def flush(self) -> str:
        """At the end of the stream, return any held-back text, U+FFFD for a broken character."""
        delta = self._decode_delta(allow_partial=True)
        if delta:
            self._chunks.append(delta)
        return delta

    def _decode_delta(self, allow_partial: bool) -> str:
        """Text of the tokens past `read_offset`, advancing the offsets when it is emitted."""
        if len(self.token_ids) == self.read_offset:
            return ""
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        window = self.token_ids[self.prefix_offset : self.read_offset]
        prefix_text = decode(window, skip_special_tokens=skip)
        full_text = decode(self.token_ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(full_text) <= len(prefix_text):
            return ""
        if full_text.endswith(_REPLACEMENT) and not allow_partial:
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return full_text[len(prefix_text) :]
