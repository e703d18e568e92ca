"""``open_gguf``: gguf's ``GGUFReader``, made fast on files with big vocabularies.

``gguf.GGUFReader`` makes a ``np.memmap`` slice (a Python-level ``__array_finalize__`` each) for
every length and every string of every array: a 128k-token vocabulary with its merges is about
half a million slices, 7-8 s before a 3B model can start (more for Gemma's 262k). This reader
gives the same fields and tensors (``ReaderField``/``ReaderTensor``, the same ``contents()``)
from three changes: the file's bytes are viewed as a plain ``ndarray`` (slicing it costs no
Python call); a numeric array is one view, cut into a row per item; and an array of strings is
a `StringArrayField` whose parse only walks its lengths (20 ms for 150k strings), decoded
straight from the bytes by ``contents()`` and cut into gguf's per-item ``parts`` only if they
are asked for. Most readers never read the strings: the engine's model config needs their
count, a tokenizer whose backend is cached (tokenizer/backend_cache.py) hashes their bytes.

Every count in the file is checked against the bytes left before anything loops over it or
slices by it (a string array declaring 2^62 items, a key-value or tensor count past the file, a
string longer than the file): such a file is a ValueError at once, not a loop that takes memory
until the machine runs out (issue 62 item 4).
"""

from __future__ import annotations

import functools
import struct
import sys

import gguf
import numpy as np
from gguf.gguf_reader import GGUFReader, ReaderField

__all__ = ["FastGGUFReader", "StringArrayField", "open_gguf"]

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
        """gguf's loop over the key-value pairs, with each string array a `StringArrayField`
        (the rest as gguf parses them)."""
        _check_fits(int(count), _MIN_KV_BYTES, offs, self._bytes.size, "key-value pairs")
        for _ in range(int(count)):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            head = [kv_klen, kv_kdata, raw_kv_type]
            name = str(bytes(kv_kdata), encoding="utf-8")
            field = self._string_array(orig_offs, name, head, offs, int(raw_kv_type[0]))
            if field is None:
                size, parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
                first = len(head)
                field = ReaderField(orig_offs, name, head + parts, [first + i for i in idxs],
                                    types)
                offs += size
            else:
                offs = field.end
            self._push_field(field, skip_sum=True)
        return offs

    def _string_array(self, orig_offs: int, name: str, head: list, offs: int,
                      raw_type: int) -> StringArrayField | None:
        """The field at ``offs`` as a `StringArrayField` if it is an array of strings in this
        machine's byte order, else None."""
        if (raw_type != _ARRAY or self.byte_order != "I" or sys.byteorder != "little"
                or int(self._get(offs, np.uint32)[0]) != _STRING):
            return None
        count = int(self._get(offs + 4, np.uint64)[0])
        start = offs + 12
        _check_fits(count, _MIN_NESTED_BYTES[_STRING], start, self._bytes.size, "STRING items")
        end = _walk_strings(memoryview(self._bytes), start, count, self._bytes.size)
        return StringArrayField.over(orig_offs, name, head, self._bytes, offs, count, end)

    def _build_tensor_info(self, offs: int, count: int):
        _check_fits(int(count), _MIN_TENSOR_INFO_BYTES, offs, self._bytes.size, "tensor infos")
        return super()._build_tensor_info(offs, count)

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        """gguf's, with a numeric array one view cut into a row per item (an array of
        strings reaches here only from a file in the other byte order: gguf's own walk)."""
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
        return super()._get_field_parts(orig_offs, raw_type)


_LENGTH = struct.Struct("<Q")


def _walk_strings(buf: memoryview, offs: int, count: int, size: int) -> int:
    """The offset past ``count`` length-prefixed strings starting at ``offs``; ValueError
    for a length that runs past the file's ``size`` bytes."""
    length = _LENGTH.unpack_from
    for _ in range(count):
        if offs + 8 > size:
            _check_fits(1, 8, offs, size, "string lengths")
        n = length(buf, offs)[0]
        if offs + 8 + n > size:  # inline: no call per item on big vocabularies
            _check_fits(n, 1, offs + 8, size, "string bytes")
        offs += 8 + n
    return offs


class StringArrayField(ReaderField):
    """A GGUF array of strings (a vocabulary, its merges) as gguf's ``ReaderField`` gives it
    (the same ``offset``, ``name``, ``data``, ``types``, ``parts`` and ``contents()``), read
    from the file's bytes when used: ``contents()`` decodes them in one pass, ``parts`` (a
    view per length and per string, as gguf makes them) is cut on first use; ``nbytes`` is
    the field's size in the file (key to last string), ``end`` the offset past it.

    NOTE: the tuple holds only the key's parts and the array header (what ``field[2]``
    gives); ``parts`` is a property."""

    # NOTE: no __slots__: the instance's dict holds the bytes and caches ``parts``
    @classmethod
    def over(cls, offset: int, name: str, head: list, data: np.ndarray, header: int,
             count: int, end: int) -> StringArrayField:
        """The field whose key-value pair starts at ``offset`` (key parts ``head``) and whose
        array header (item type, count) is at ``header``, ``count`` strings ending at
        ``end``, in the file's bytes ``data``."""
        itype = data[header:header + 4].view(np.uint32)
        alen = data[header + 4:header + 12].view(np.uint64)
        first = len(head) + 3  # parts: key's, item type, count, then (length, bytes) each
        field = super().__new__(cls, offset, name, [*head, itype, alen],
                                list(range(first, first + 2 * count, 2)),
                                [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING])
        field.__dict__.update(_data=data, _start=header + 12, end=end)
        return field

    @property
    def nbytes(self) -> int:
        return self.end - self.offset

    @functools.cached_property
    def parts(self) -> list[np.ndarray]:
        data, offs = self._data, self._start
        parts = list(self[2])
        for _ in range(len(self.data)):
            n = _LENGTH.unpack_from(data, offs)[0]
            parts.append(data[offs:offs + 8].view(np.uint64))
            parts.append(data[offs + 8:offs + 8 + n])
            offs += 8 + n
        return parts

    def contents(self, index_or_slice: int | slice = slice(None)):
        """The strings (``index_or_slice`` of them: one string for an int), decoded as UTF-8
        (a bad byte is a UnicodeDecodeError, as in gguf)."""
        wanted = range(len(self.data))[index_or_slice]  # IndexError as a list's
        raw = self._data[self._start:self.end].tobytes()
        length = _LENGTH.unpack_from
        out, offs = [], 0
        for _ in range(wanted + 1 if isinstance(wanted, int) else len(self.data)):
            n = length(raw, offs)[0]
            out.append(raw[offs + 8:offs + 8 + n])
            offs += 8 + n
        if isinstance(wanted, int):
            return out[wanted].decode("utf-8")
        return [out[i].decode("utf-8") for i in wanted]


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
