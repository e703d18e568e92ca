"""Hand-built GGUF files whose counts lie (issue 62 item 4): a header that declares more items
than the file's bytes could hold. Shared by tests/test_gguf_bounds.py and
benchmarks/reliability/file_attacks.py."""

from __future__ import annotations

import struct

_MAGIC = b"GGUF"
_STRING, _ARRAY, _UINT32 = 8, 9, 4


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _header(num_tensors: int, num_kv: int) -> bytes:
    return _MAGIC + struct.pack("<IQQ", 3, num_tensors, num_kv)


def _kv_u32(key: str, value: int) -> bytes:
    return _str(key) + struct.pack("<II", _UINT32, value)


def _arch() -> bytes:
    return _str("general.architecture") + struct.pack("<I", _STRING) + _str("llama")


def string_array(num_declared: int, items: list[str]) -> bytes:
    """A llama file whose ``tokenizer.ggml.tokens`` declares ``num_declared`` strings and
    holds ``items``."""
    tokens = (_str("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, num_declared)
              + b"".join(_str(item) for item in items))
    return _header(0, 2) + _arch() + tokens


def huge_string_array(num_items: int = 2**62) -> bytes:
    """``tokenizer.ggml.tokens``: an array of strings declaring ``num_items``, holding three."""
    return string_array(num_items, ["a", "b", "c"])


def huge_numeric_array(num_items: int = 2**62) -> bytes:
    """``tokenizer.ggml.token_type``: a uint32 array declaring ``num_items``, holding two."""
    types = (_str("tokenizer.ggml.token_type") + struct.pack("<IIQ", _ARRAY, _UINT32, num_items)
             + struct.pack("<II", 1, 1))
    return _header(0, 2) + _arch() + types


def huge_kv_count(num_kv: int = 2**62) -> bytes:
    """A header declaring ``num_kv`` metadata pairs, followed by one."""
    return _header(0, num_kv) + _arch()


def huge_tensor_count(num_tensors: int = 2**62) -> bytes:
    """A header declaring ``num_tensors`` tensors and no tensor infos."""
    return _header(num_tensors, 1) + _arch()


def huge_string(length: int = 2**62) -> bytes:
    """A key whose string value declares ``length`` bytes."""
    return _header(0, 1) + _str("general.name") + struct.pack("<IQ", _STRING, length) + b"x" * 8


def lying_string_item() -> bytes:
    """An honest item count, but the second string's length runs past the end."""
    tokens = (_str("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, 2)
              + _str("a") + struct.pack("<Q", 2**40) + b"bb")
    return _header(0, 2) + _arch() + tokens


def many_dims() -> bytes:
    """A tensor info whose dimension count is 2^32 - 1."""
    info = _str("t") + struct.pack("<I", 2**32 - 1) + struct.pack("<Q", 1) * 4
    return _header(1, 1) + _arch() + info


ALL = {"huge string array": huge_string_array, "huge numeric array": huge_numeric_array,
       "huge kv count": huge_kv_count, "huge tensor count": huge_tensor_count,
       "huge string": huge_string, "lying string item": lying_string_item,
       "many dims": many_dims}
