"""``open_gguf``: gguf's ``GGUFReader``, made fast on files with big vocabularies.

``gguf.GGUFReader`` makes a ``np.memmap`` slice (a Python-level ``__array_finalize__`` each) for
every length and every string of every array: a 128k-token vocabulary with its merges is about
half a million slices, 7-8 s before a 3B model can start (more for Gemma's 262k). This reader
gives the same fields and tensors (``ReaderField``/``ReaderTensor``, the same ``contents()``)
from two changes: the file's bytes are viewed as a plain ``ndarray`` (slicing it costs no Python
call), and an array of strings is walked over the bytes in one loop instead of one recursive
call per item (a numeric array is one view, cut into a row per item).
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from gguf.gguf_reader import GGUFReader

__all__ = ["FastGGUFReader", "open_gguf"]

_STRING = gguf.GGUFValueType.STRING
_ARRAY = gguf.GGUFValueType.ARRAY


class FastGGUFReader(GGUFReader):
    """A ``GGUFReader`` whose metadata parse is fast (see the module docstring)."""

    @property
    def data(self) -> np.ndarray:
        return self._bytes

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self.mapped = value  # the np.memmap (its ``_mmap`` takes madvise: gguf_stored.py)
        self._bytes = value.view(np.ndarray)  # the same buffer, without the subclass

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != _ARRAY or self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        offs = orig_offs + 12
        item = gguf.GGUFValueType(int(raw_itype[0]))
        nptype = self.gguf_scalar_to_np.get(item)
        if nptype is not None and alen[0] > 0:  # numbers: one view, a row per item
            values = self._get(offs, nptype, int(alen[0]))
            parts = [raw_itype, alen, *values.reshape(-1, 1)]
            return (12 + values.nbytes, parts, list(range(2, len(parts))),
                    [gguf.GGUFValueType.ARRAY, item])
        if item != _STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        buf = memoryview(self._bytes)
        data = self._bytes
        parts: list[np.ndarray] = [raw_itype, alen]
        for _ in range(int(alen[0])):
            n = int.from_bytes(buf[offs:offs + 8], "little")
            parts.append(data[offs:offs + 8].view(np.uint64))
            parts.append(data[offs + 8:offs + 8 + n])
            offs += 8 + n
        idxs = list(range(3, len(parts), 2))
        return offs - orig_offs, parts, idxs, [gguf.GGUFValueType.ARRAY, _STRING]


def open_gguf(path) -> FastGGUFReader:
    """The file's reader; ValueError if it is not a readable GGUF."""
    try:
        return FastGGUFReader(path)
    except Exception as exc:  # the reader raises assorted errors on bad files
        raise ValueError(f"{path} is not a valid GGUF file (corrupt or truncated?): {exc}") from exc
