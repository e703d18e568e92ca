"""A lower bound on a text's token count from its length alone, without tokenizing it.

Every token stands for at most ``L`` bytes of (normalized) text, ``L`` the longest token of the
vocabulary in bytes (added tokens included), so a text of ``B`` bytes has at least ``B / L``
tokens; and a character is at least one byte, so ``chars / L`` is a bound too — one that costs
nothing (``len(str)``). A server refuses a prompt whose bound already exceeds the context
window before tokenizing it (a 30 MB prompt would take tens of seconds and gigabytes).

The bound holds only when nothing between the text and the tokens can shrink the text more than
by a known factor: the normalizers (Unicode composition merges at most ``_COMPOSE`` characters
into one; stripping accents or whitespace is unbounded), the pre-tokenizers (whitespace
splitters drop the spaces) and the model (an unknown-token id may stand for a whole word). For
any other pipeline `max_chars_per_token` answers None and prompts are tokenized in full.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from radixserve.tokenizer.byte_pieces import TokenBytes, token_bytes

# NOTE: canonical composition merges a base and its marks into one character: at most 4 → 1
# (Greek: alpha + psili + oxia + ypogegrammeni); 8 leaves a margin.
_COMPOSE = 8
_UNICODE_NORMALIZERS = {"NFC", "NFKC", "NFD", "NFKD", "Lowercase", "Precompiled"}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts",
                           "Split", "FixedLength"}


def max_chars_per_token(backend: HFTokenizer, table: TokenBytes | None = None) -> int | None:
    """``k`` such that a text of ``c`` characters has at least ``c / k`` tokens, or None when
    this tokenizer's pipeline gives no such bound (see the module docstring). ``table``: the
    tokenizer's token -> bytes table where it has one already (else it is built here).
    Reads the pipeline's parts, not the whole tokenizer's JSON (for a 152k vocabulary, parsing
    that took 0.3 s and left 38 MB of heap behind)."""
    pre_tokenizer = _spec(backend.pre_tokenizer)
    shrink = _normalizer_shrink(_spec(backend.normalizer))
    if shrink is None or not _pre_tokenizer_keeps(pre_tokenizer):
        return None
    if not _model_covers_every_char(_model_spec(backend.model), pre_tokenizer):
        return None
    longest = _longest_token_bytes(backend, table)
    return longest * shrink if longest else None


def _spec(part) -> dict | None:
    """A normalizer's or pre-tokenizer's settings as the tokenizer's JSON spells them."""
    return None if part is None else json.loads(part.__getstate__())


def _model_spec(model) -> dict:
    """The model's type and unknown-token settings: a BPE's from its attributes (its JSON
    holds the whole vocabulary and merges), another's from its JSON."""
    if isinstance(model, models.BPE):
        return {"type": "BPE", "byte_fallback": model.byte_fallback,
                "unk_token": model.unk_token, "fuse_unk": model.fuse_unk}
    return json.loads(model.__getstate__())


def _longest_token_bytes(backend: HFTokenizer, table: TokenBytes | None) -> int:
    """The most bytes a token of the vocabulary stands for (as the model sees its input)."""
    table = table or token_bytes(backend)
    if table is not None:
        longest = max((len(p) for p in table.pieces), default=0)
    else:  # the vocabulary's spelling; a byte-level or ▁ spelling is never shorter
        longest = max((len(t.encode("utf-8")) for t in backend.get_vocab()), default=0)
    added = backend.get_added_tokens_decoder().values()
    return max([longest, *(len(t.content.encode("utf-8")) for t in added)])


def _normalizer_shrink(spec: dict | None) -> int | None:
    """How many characters a normalizer may turn into one (1: it never shrinks text)."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for step in spec.get("normalizers", []):
            one = _normalizer_shrink(step)
            if one is None:
                return None
            factor *= one
        return factor
    if kind in _UNICODE_NORMALIZERS:
        return _COMPOSE
    if kind == "Prepend":
        return 1
    if kind == "Replace":
        pattern = spec.get("pattern", {}).get("String")
        content = spec.get("content", "")
        if pattern is None or not content:
            return None  # a regex or a deletion: unbounded
        return max(1, -(-len(pattern) // len(content)))
    return None  # Strip, StripAccents, BertNormalizer, ...: may delete any amount


def _pre_tokenizer_keeps(spec: dict | None) -> bool:
    """Whether the pre-tokenizer keeps every character (splitting only)."""
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps(s) for s in spec.get("pretokenizers", []))
    if kind == "Split":
        return spec.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS


def _model_covers_every_char(model: dict, pre_tokenizer: dict | None) -> bool:
    """Whether every token stands for the characters it covers, never an unknown-token id for
    a run of them (byte-level input or byte fallback cannot be unknown; without an unknown
    token nothing can be)."""
    kind = model.get("type")
    if kind not in ("BPE", "Unigram"):
        return False  # WordPiece / WordLevel: one [UNK] for a whole word
    if model.get("byte_fallback") or _has_byte_level(pre_tokenizer):
        return True
    unk = model.get("unk_token") if kind == "BPE" else model.get("unk_id")
    return unk is None or (kind == "BPE" and not model.get("fuse_unk"))


def _has_byte_level(spec: dict | None) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_has_byte_level(s) for s in spec.get("pretokenizers", []))
    return spec.get("type") == "ByteLevel"
