"""Tokenizing chat prompts piece by piece, remembering the pieces.

A chat prompt is the template's special tokens around message texts, and a conversation
resends its whole history every turn. Hugging Face ``tokenizers`` splits its input at added
tokens before anything else and encodes the text between them independently, so encoding each
piece on its own and concatenating gives exactly the ids of encoding the whole text; the
pieces already seen (earlier turns, the system prompt, tool definitions) come from a cache.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from tokenizers import Tokenizer as HFTokenizer

_MAX_PIECES = 8192
_MAX_PIECE_CHARS = 65536


class SegmentCachedEncoder:
    """``encode(text)`` == ``backend.encode(text, add_special_tokens=False).ids``.

    When an added token has strip or normalisation options (its match would eat or transform
    neighbouring text) the pieces are not independent, and every call encodes the whole text.
    """

    def __init__(self, backend: HFTokenizer) -> None:
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        independent = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized)
                          for t in added.values())
        self._added = {t.content: i for i, t in added.items()} if independent else {}
        alternatives = sorted(self._added, key=len, reverse=True)  # longest match first
        self._split = (re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")
                       if alternatives else None)
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._backend.encode(text, add_special_tokens=False).ids
        parts = [p for p in self._split.split(text) if p]
        missing = [p for p in dict.fromkeys(parts) if p not in self._added
                   and p not in self._pieces]
        fresh = dict(zip(missing, (e.ids for e in self._backend.encode_batch_fast(
            missing, add_special_tokens=False)))) if missing else {}
        ids: list[int] = []
        for part in parts:
            special = self._added.get(part)
            if special is not None:
                ids.append(special)
                continue
            piece = fresh.get(part)
            if piece is None:
                piece = self._pieces[part]
                self._pieces.move_to_end(part)
            elif len(part) <= _MAX_PIECE_CHARS:
                self._pieces[part] = piece
            ids.extend(piece)
        while len(self._pieces) > _MAX_PIECES:
            self._pieces.popitem(last=False)
        return ids
