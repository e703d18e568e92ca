"""``open_gguf``: gguf's ``GGUFReader``, made fast on files with big vocabularies.

``gguf.GGUFReader`` makes a ``np.memmap`` slice (a Python-level ``__array_finalize__`` each) for
every length and every string of every array: a 128k-token vocabulary with its merges is about
half a million slices, 7-8 s before a 3B model can start (more for Gemma's 262k). This reader
gives the same fields and tensors (``ReaderField``/``ReaderTensor``, the same ``contents()``)
from two changes: the file's bytes are viewed as a plain ``ndarray`` (slicing it costs no Python
call), and an array of strings is walked over the bytes in one loop instead of one recursive
call per item (a numeric array is one view, cut into a row per item).

Every count in the file is checked against the bytes left before anything loops over it or
slices by it (a string array declaring 2^62 items, a key-value or tensor count past the file, a
string longer than the file): such a file is a ValueError at once, not a loop that takes memory
until the machine runs out (issue 62 item 4).
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
from gguf.gguf_reader import GGUFReader

__all__ = ["FastGGUFReader", "open_gguf"]

_STRING = gguf.GGUFValueType.STRING
_ARRAY = gguf.GGUFValueType.ARRAY

# The fewest bytes one item can take, to bound a count by the bytes left: a key-value pair is a
# key (8-byte length), a 4-byte type and a value of at least 1 byte; a tensor info is a name
# (8-byte length), a 4-byte dimension count, a 4-byte type and an 8-byte offset; an array item
# is a string's 8-byte length, a nested array's 12-byte header or a number's own size.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_MIN_NESTED_BYTES = {_STRING: 8, _ARRAY: 4 + 8}


class FastGGUFReader(GGUFReader):
    """A ``GGUFReader`` whose metadata parse is fast (see the module docstring)."""

    @property
    def data(self) -> np.ndarray:
        return self._bytes

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self.mapped = value  # the np.memmap (its ``_mmap`` takes madvise: gguf_stored.py)
        self._bytes = value.view(np.ndarray)  # the same buffer, without the subclass

    def _get(self, offset: int, dtype, count: int = 1, override_order=None) -> np.ndarray:
        """gguf's ``_get``, but a read past the end of the file is a ValueError (gguf's gives
        a short array, or slices by a count the file cannot hold)."""
        count, dt = int(count), np.dtype(dtype)
        _check_fits(count, dt.itemsize, offset, self._bytes.size, dt.name)
        return super()._get(offset, dtype, count, override_order)

    def _build_fields(self, offs: int, count: int) -> int:
        _check_fits(int(count), _MIN_KV_BYTES, offs, self._bytes.size, "key-value pairs")
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int):
        _check_fits(int(count), _MIN_TENSOR_INFO_BYTES, offs, self._bytes.size, "tensor infos")
        return super()._build_tensor_info(offs, count)

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != _ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        offs = orig_offs + 12
        item = gguf.GGUFValueType(int(raw_itype[0]))  # ValueError on an unknown type
        nptype = self.gguf_scalar_to_np.get(item)
        min_item = np.dtype(nptype).itemsize if nptype else _MIN_NESTED_BYTES[item]
        _check_fits(int(alen[0]), min_item, offs, self._bytes.size, f"{item.name} items")
        if self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
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
        size = data.size
        for _ in range(int(alen[0])):
            n = int.from_bytes(buf[offs:offs + 8], "little")
            if offs + 8 + n > size:  # inline: no call per item on big vocabularies
                _check_fits(n, 1, offs + 8, size, "string bytes")
            parts.append(data[offs:offs + 8].view(np.uint64))
            parts.append(data[offs + 8:offs + 8 + n])
            offs += 8 + n
        idxs = list(range(3, len(parts), 2))
        return offs - orig_offs, parts, idxs, [gguf.GGUFValueType.ARRAY, _STRING]


def _check_fits(count: int, item_bytes: int, offset: int, file_bytes: int, what: str) -> None:
    """ValueError unless ``count`` items of at least ``item_bytes`` each fit in the bytes
    left after ``offset``."""
    left = max(file_bytes - offset, 0)
    if count < 0 or count * item_bytes > left:
        raise ValueError(f"{count} {what} at byte {offset} cannot fit in the {left} bytes left "
                         f"in the file")


def open_gguf(path) -> FastGGUFReader:
    """The file's reader; ValueError if it is not a readable GGUF."""
    try:
        return FastGGUFReader(path)
    except Exception as exc:  # the reader raises assorted errors on bad files
        raise ValueError(f"{path} is not a valid GGUF file (corrupt or truncated?): {exc}") from exc
