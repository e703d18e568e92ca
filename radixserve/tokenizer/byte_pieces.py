"""Detokenization without the tokenizer for byte-level BPE models (GPT-2, Llama 3, Qwen,
SmolLM) and SentencePiece ones (Llama 2, Mistral, Gemma): each token id stands for fixed bytes,
and the text of a sequence is the UTF-8 reading of their concatenation (what the ``ByteLevel``
decoder of ``tokenizers`` does, and its SentencePiece chain ``▁`` → space, ``<0xNN>`` → that
byte). So a streamed token costs a list lookup and an incremental UTF-8 decode, instead of two
calls into the tokenizer per token per request (``IncrementalDetokenizer``, which stays the
path for every other decoder), and a character spelled by several byte-fallback tokens comes
out whole once its last byte arrives.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class TokenBytes:
    """What a decoder makes of each token id, for decoders that map every token to fixed
    bytes and read their concatenation as UTF-8."""

    pieces: list[bytes]  # by token id
    special_ids: frozenset[int]  # the ids ``skip_special_tokens`` drops
    strips_first_space: bool  # the decoder drops one space at the start of a text


def _is_spm_decoder(decoder: decoders.Decoder | None) -> bool | None:
    """For SentencePiece's decoder (``▁`` → space, byte fallback, fuse, then maybe strip one
    leading space): whether it strips; None for any other decoder."""
    if not isinstance(decoder, decoders.Sequence):
        return None
    steps = json.loads(decoder.__getstate__())["decoders"]
    strips = steps[-1:] == [{"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    spm = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
           {"type": "ByteFallback"}, {"type": "Fuse"}]
    return strips if steps[: len(steps) - strips] == spm else None


def _spm_piece(token: str) -> bytes:
    """A SentencePiece token's bytes: ``<0xNN>`` is that byte (``ByteFallback``), else the
    text with ``▁`` as a space."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes((int(token[3:5], 16),))
        except ValueError:
            pass
    return token.replace("\u2581", " ").encode("utf-8")


_BYTE_OF_CHAR = _byte_of_char()
# each byte-level character to the character of its byte's code (latin-1 then encodes it to
# that byte): a whole token in one str.translate, 3x faster than a join per character
_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _BYTE_OF_CHAR.items()})
_NOT_BYTE_LEVEL = re.compile("[^" + "".join(map(re.escape, _BYTE_OF_CHAR)) + "]")


def _byte_level_piece(token: str) -> bytes:
    """A byte-level token's bytes: each character of GPT-2's table is its byte, any other (an
    added token's text) its UTF-8."""
    if _NOT_BYTE_LEVEL.search(token) is None:
        return token.translate(_TO_LATIN1).encode("latin-1")
    return b"".join(bytes((_BYTE_OF_CHAR[c],)) if c in _BYTE_OF_CHAR else c.encode("utf-8")
                    for c in token)


def token_bytes(backend: HFTokenizer) -> TokenBytes | None:
    """The bytes of every token id when ``backend``'s decoder is byte-level (GPT-2 style) or
    SentencePiece's (see ``_is_spm_decoder``), else None."""
    strips = False
    if isinstance(backend.decoder, decoders.ByteLevel):
        piece = _byte_level_piece
    else:
        spm = _is_spm_decoder(backend.decoder)
        if spm is None:
            return None
        strips, piece = spm, _spm_piece
    size = backend.get_vocab_size(with_added_tokens=True)
    pieces = [b""] * size
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if token_id < size:
            pieces[token_id] = piece(token)
    special = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
    return TokenBytes(pieces, special, strips)


class ByteLevelDetokenizer:
    """Same contract as ``IncrementalDetokenizer`` (the concatenated deltas equal
    ``tokenizer.decode(output_ids)``; a delta never ends inside a UTF-8 character), for a
    ``TokenBytes`` table: an incomplete character is held by the UTF-8 decoder until the
    token that completes it arrives.

    ``strip_first_space``: drop one space at the very start of the output, as a SentencePiece
    decoder does at the start of a text; the caller sets it only when the output starts the
    text (a continuation of a prompt keeps its first space, as decoding prompt and output
    together would).

    NOTE: bytes that are not UTF-8 become U+FFFD by Python's rule (one per maximal invalid
    run); ``tokenizers``' ByteFallback turns every token of such a byte run into U+FFFD, so
    only on broken UTF-8 can the two differ.
    """

    def __init__(self, pieces: list[bytes], special_ids: frozenset[int],
                 skip_special_tokens: bool = True, strip_first_space: bool = False) -> None:
        self.pieces = pieces
        self.skip = special_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._strip = strip_first_space

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Append ``new_token_ids``; return the text they complete."""
        pieces, skip, n = self.pieces, self.skip, len(self.pieces)
        # ids the vocabulary does not have (a model's padded rows) decode to nothing, as in
        # ``tokenizers``
        data = b"".join([pieces[i] for i in new_token_ids if i < n and i not in skip])
        if not data:
            return ""
        if self._strip:
            self._strip = False
            data = data[1:] if data[:1] == b" " else data
        return self._utf8.decode(data)

    def flush(self) -> str:
        """At the end of the stream: U+FFFD for a character left incomplete."""
        return self._utf8.decode(b"", final=True)
