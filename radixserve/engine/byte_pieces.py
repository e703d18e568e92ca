"""Detokenization without the tokenizer for byte-level BPE models (GPT-2, Llama 3, Qwen,
SmolLM): each token id stands for fixed bytes, and the text of a sequence is the UTF-8
reading of their concatenation (what the ``ByteLevel`` decoder of ``tokenizers`` does). So a
streamed token costs a list lookup and an incremental UTF-8 decode, instead of two calls
into the tokenizer per token per request (``IncrementalDetokenizer``, which stays the path for
every other decoder).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, reversed: the character each byte is
    spelled with in a byte-level vocabulary → that byte (the mapping is fixed by the
    format; ``tokenizers`` does not expose it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def byte_level_pieces(backend: HFTokenizer) -> tuple[list[bytes], frozenset[int]] | None:
    """(bytes of every token id, the special ids) when ``backend`` decodes byte-level — its
    decoder is exactly ``ByteLevel`` — else None."""
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    byte_of = _byte_of_char()
    size = backend.get_vocab_size(with_added_tokens=True)
    pieces = [b""] * size
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if token_id < size:
            pieces[token_id] = b"".join(
                bytes((byte_of[c],)) if c in byte_of else c.encode("utf-8") for c in token)
    special = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
    return pieces, special


class ByteLevelDetokenizer:
    """Same contract as ``IncrementalDetokenizer`` (the concatenated deltas equal
    ``tokenizer.decode(output_ids)``; a delta never ends inside a UTF-8 character), for a
    byte-level vocabulary: an incomplete character is held by the UTF-8 decoder until the
    token that completes it arrives."""

    def __init__(self, pieces: list[bytes], special_ids: frozenset[int],
                 skip_special_tokens: bool = True) -> None:
        self.pieces = pieces
        self.skip = special_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Append ``new_token_ids``; return the text they complete."""
        pieces, skip, n = self.pieces, self.skip, len(self.pieces)
        # ids the vocabulary does not have (a model's padded rows) decode to nothing, as in
        # ``tokenizers``
        data = b"".join([pieces[i] for i in new_token_ids if i < n and i not in skip])
        return self._utf8.decode(data) if data else ""

    def flush(self) -> str:
        """At the end of the stream: U+FFFD for a character left incomplete."""
        return self._utf8.decode(b"", final=True)
