"""Vectorised torch dequantizers for GGUF tensor data.

``dequantize(data, qtype, shape)`` turns the raw bytes of a GGUF tensor (as
``gguf.GGUFReader(path).tensors[i].data`` returns them) into a float32 torch
tensor.  Block layouts follow ggml (``ggml-common.h``) and match the reference
numpy code in ``gguf.quants``:

* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 values with one f16 scale ``d``
  (and an f16 minimum ``m`` for the ``_1`` variants).
* Q4_K, Q5_K, Q6_K: super-blocks of QK_K=256 values; Q4_K/Q5_K carry f16
  ``d``/``dmin`` and eight 6-bit (scale, min) pairs packed into 12 bytes,
  Q6_K carries sixteen int8 scales and an f16 ``d``.

All work is done with whole-tensor torch ops (no Python loop over blocks), so a
torch input keeps its device: move the uint8 bytes to the GPU first to
dequantize there.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

__all__ = ["SUPPORTED_TYPES", "dequantize"]

_T = GGMLQuantizationType
_FLOAT_TYPES = {_T.F32: torch.float32, _T.F16: torch.float16, _T.BF16: torch.bfloat16}


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """Read the little-endian f16 at byte ``start`` of every block as float32, shape (n, 1)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _shifts(values: list[int], like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=like.device).reshape(shape)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, 16) packed bytes -> (n, 32) values: low nibbles first, then high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, 1, 16) >> _shifts([0, 4], qs, (1, 2, 1))
    return (q & 0x0F).reshape(n, 32)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) bits, bit j at column j."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(list(range(8)), qh, (1, 1, 8))) & 1).reshape(n, 32)


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b, 0)


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:]).to(torch.int8) - 8
    return _f16(b, 0) * q.float()


def _deq_q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _nibbles(b[:, 4:]).float() + _f16(b, 2)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(b[:, 6:]) | (_bits32(b[:, 2:6]) << 4)).to(torch.int8) - 16
    return _f16(b, 0) * q.float()


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:]) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte Q4_K/Q5_K scale field into eight 6-bit scales and mins.

    Byte layout (ggml ``get_scale_min_k4``), sub-blocks 0-3 in the low 6 bits of
    bytes 0-3 (scales) / 4-7 (mins); sub-blocks 4-7 take their low 4 bits from
    bytes 8-11 and their top 2 bits from the spare high bits of bytes 0-7.
    """
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def _k4_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sub-block (n, 8, 1) multipliers d*sc and offsets dmin*m for Q4_K/Q5_K."""
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    return (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    # 2 d + 2 dmin + 12 scales + 128 qs; each 32-byte chunk of qs holds two
    # sub-blocks: low nibbles then high nibbles.
    n = b.shape[0]
    d, dm = _k4_scales(b)
    q = (b[:, 16:].reshape(n, 4, 1, 32) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    return (d * q.reshape(n, 8, 32).float() - dm).reshape(n, QK_K)


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    # 2 d + 2 dmin + 12 scales + 32 qh + 128 qs; bit i of qh[l] is the 5th bit
    # of element l of sub-block i.
    n = b.shape[0]
    d, dm = _k4_scales(b)
    ql = (b[:, 48:].reshape(n, 4, 1, 32) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    qh = (b[:, 16:48].reshape(n, 1, 32) >> _shifts(list(range(8)), b, (1, 8, 1))) & 1
    q = ql.reshape(n, 8, 32) | (qh << 4)
    return (d * q.float() - dm).reshape(n, QK_K)


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    # 128 ql + 64 qh + 16 int8 scales + 2 d.  Each 128-value half uses 64 ql
    # bytes (low nibbles, then high nibbles) and 32 qh bytes (2 bits per value).
    n = b.shape[0]
    ql = (b[:, :128].reshape(n, 2, 1, 64) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], b, (1, 1, 4, 1))) & 3
    q = (ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b, 208) * scales).reshape(n, 16, 1)
    return (d * q.reshape(n, 16, 16).float()).reshape(n, QK_K)


_BLOCK_DEQUANT = {
    _T.Q8_0: _deq_q8_0,
    _T.Q4_0: _deq_q4_0,
    _T.Q4_1: _deq_q4_1,
    _T.Q5_0: _deq_q5_0,
    _T.Q5_1: _deq_q5_1,
    _T.Q4_K: _deq_q4_k,
    _T.Q5_K: _deq_q5_k,
    _T.Q6_K: _deq_q6_k,
}

SUPPORTED_TYPES: tuple[str, ...] = tuple(t.name for t in (*_FLOAT_TYPES, *_BLOCK_DEQUANT))


def _to_torch(data: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data.contiguous()
    data = np.ascontiguousarray(data)
    if not data.flags.writeable:
        # GGUFReader hands out read-only memmaps. Every path below produces a
        # fresh tensor (F32 clones), so the shared buffer is never written.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(data)
    return torch.from_numpy(data)


def dequantize(
    data: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> torch.Tensor:
    """Dequantize raw GGUF tensor data to a float32 tensor of ``shape``.

    ``data`` is the tensor's data as GGUFReader returns it (any dtype; only its
    bytes matter), ``shape`` the logical row-major torch shape, i.e. the
    reversed GGUF ``tensor.shape``.  The result is on ``data``'s device and
    never shares memory with ``data``.
    """
    try:
        qtype = GGMLQuantizationType(qtype)
    except ValueError:
        pass
    name = getattr(qtype, "name", str(qtype))
    if qtype not in _FLOAT_TYPES and qtype not in _BLOCK_DEQUANT:
        raise ValueError(
            f"unsupported GGUF tensor type {name}; supported: {', '.join(SUPPORTED_TYPES)}"
        )

    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape, dtype=np.int64))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[-1] % block_size != 0:
        raise ValueError(f"{name}: last dim {shape[-1]} is not a multiple of {block_size}")
    raw = _to_torch(data).reshape(-1).view(torch.uint8)
    expected = numel // block_size * type_size
    if raw.numel() != expected:
        raise ValueError(
            f"{name}: got {raw.numel()} bytes for shape {shape}, expected {expected}"
        )

    if qtype in _FLOAT_TYPES:
        out = raw.view(_FLOAT_TYPES[qtype])
        out = out.clone() if qtype == _T.F32 else out.float()
    else:
        out = _BLOCK_DEQUANT[qtype](raw.reshape(-1, type_size))
    return out.reshape(shape)


# -- 4-bit blocks kept as they are (for the native 4-bit linear) --------------------------

Q4_TYPES = (_T.Q4_0, _T.Q4_1)


def q4_blocks(data: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType,
              shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0 or Q4_1 matrix of ``shape`` [N, K] → (codes ``q`` [N, K] uint8 in 0..15, ``d`` and
    ``m`` [N, K / 32] float16) with ``weight = d * q + m`` per 32-column block, exactly the
    values ``dequantize`` gives (Q4_0 stores ``d * (q - 8)``, so ``m = -8 d``, exact in f16)."""
    qtype = GGMLQuantizationType(qtype)
    if qtype not in Q4_TYPES or len(shape) != 2:
        raise ValueError(f"not a Q4_0/Q4_1 matrix: {qtype.name} {tuple(shape)}")
    n, k = (int(s) for s in shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = _to_torch(data).reshape(-1).view(torch.uint8)
    if k % block_size or raw.numel() != n * k // block_size * type_size:
        raise ValueError(f"{qtype.name}: {raw.numel()} bytes do not hold a {n}x{k} matrix")
    b = raw.reshape(-1, type_size)
    d = b[:, 0:2].contiguous().view(torch.float16)
    if qtype == _T.Q4_1:
        m, codes = b[:, 2:4].contiguous().view(torch.float16), b[:, 4:]
    else:
        m, codes = d * -8.0, b[:, 2:]
    blocks = k // block_size
    return _nibbles(codes).reshape(n, k), d.reshape(n, blocks), m.reshape(n, blocks)
