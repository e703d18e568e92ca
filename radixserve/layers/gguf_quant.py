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

All work on these is done with whole-tensor torch ops (no Python loop over blocks), so a
torch input keeps its device: move the uint8 bytes to the GPU first to
dequantize there.

The other types a file may store (``REFERENCE_TYPES``: Q2_K, Q3_K, the ternary TQ1_0 / TQ2_0,
MXFP4, the non-linear IQ4_NL / IQ4_XS and the codebook IQ1-IQ3 types) are dequantized by
gguf-py's own numpy code (``gguf.quants.dequantize``, the reference every kernel of ours is
tested against), on the CPU, the result moved to the input's device: their values are then the
reference's by construction, bit for bit. They are element-wise per block, so any subset of a
tensor's rows dequantizes to exactly those rows of the whole.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf import quants as gguf_quants

__all__ = ["REFERENCE_TYPES", "SUPPORTED_TYPES", "dequantize"]

_T = GGMLQuantizationType
_FLOAT_TYPES = {_T.F32: torch.float32, _T.F16: torch.float16, _T.BF16: torch.bfloat16}


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The f16 at byte ``start`` of every block, as float16, shape (n, 1)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16)


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


# -- every block type as codes and fields ------------------------------------------------------
# A block of 32 * U weights splits losslessly into unsigned codes and the block's stored fields
# (f16 scales as float16 tensors, 6-bit / int8 sub-block scales as integer tensors), each
# (n, ...) for n blocks; `_scale_offset` turns the fields into the weight = scale * code + offset
# of every sub-block, in float32 and exactly (an f16 times a small integer).


def _split_q8_0(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    codes = (b[:, 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
    return codes, {"d": _half(b, 0)}


def _split_q4_0(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _nibbles(b[:, 2:]), {"d": _half(b, 0)}


def _split_q4_1(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _nibbles(b[:, 4:]), {"d": _half(b, 0), "m": _half(b, 2)}


def _split_q5_0(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _nibbles(b[:, 6:]) | (_bits32(b[:, 2:6]) << 4), {"d": _half(b, 0)}


def _split_q5_1(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return (_nibbles(b[:, 8:]) | (_bits32(b[:, 4:8]) << 4),
            {"d": _half(b, 0), "m": _half(b, 2)})


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte Q4_K/Q5_K scale field into eight 6-bit scales and mins (uint8).

    Byte layout (ggml ``get_scale_min_k4``), sub-blocks 0-3 in the low 6 bits of
    bytes 0-3 (scales) / 4-7 (mins); sub-blocks 4-7 take their low 4 bits from
    bytes 8-11 and their top 2 bits from the spare high bits of bytes 0-7.
    """
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k4_fields(b: torch.Tensor) -> dict[str, torch.Tensor]:
    sc, mn = _scale_min_k4(b[:, 4:16])
    return {"d": _half(b, 0), "dmin": _half(b, 2), "sc": sc, "mn": mn}


def _split_q4_k(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # 2 d + 2 dmin + 12 scales + 128 qs; each 32-byte chunk of qs holds two
    # sub-blocks: low nibbles then high nibbles.
    n = b.shape[0]
    q = (b[:, 16:].reshape(n, 4, 1, 32) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    return q.reshape(n, QK_K), _k4_fields(b)


def _split_q5_k(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # 2 d + 2 dmin + 12 scales + 32 qh + 128 qs; bit i of qh[l] is the 5th bit
    # of element l of sub-block i.
    n = b.shape[0]
    ql = (b[:, 48:].reshape(n, 4, 1, 32) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    qh = (b[:, 16:48].reshape(n, 1, 32) >> _shifts(list(range(8)), b, (1, 8, 1))) & 1
    return (ql.reshape(n, 8, 32) | (qh << 4)).reshape(n, QK_K), _k4_fields(b)


def _split_q6_k(b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # 128 ql + 64 qh + 16 int8 scales + 2 d.  Each 128-value half uses 64 ql
    # bytes (low nibbles, then high nibbles) and 32 qh bytes (2 bits per value).
    n = b.shape[0]
    ql = (b[:, :128].reshape(n, 2, 1, 64) >> _shifts([0, 4], b, (1, 1, 2, 1))) & 0x0F
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], b, (1, 1, 4, 1))) & 3
    q = ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)
    return q.reshape(n, QK_K), {"d": _half(b, 208),
                                "sc": b[:, 192:208].contiguous().view(torch.int8)}


def _scale_offset(qtype: GGMLQuantizationType, f: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block and sub-block (n, G) float32: weight = scale * code + offset."""
    d = f["d"].float()
    if qtype in (_T.Q4_1, _T.Q5_1):
        return d, f["m"].float()
    if qtype in _LEGACY_OFFSETS:
        return d, d * _LEGACY_OFFSETS[qtype]
    scale = d * f["sc"].float()
    if qtype == _T.Q6_K:
        return scale, scale * -32.0
    return scale, -(f["dmin"].float() * f["mn"].float())


_LEGACY_OFFSETS = {_T.Q4_0: -8.0, _T.Q5_0: -16.0, _T.Q8_0: -128.0}
_SPLIT = {
    _T.Q8_0: _split_q8_0,
    _T.Q4_0: _split_q4_0,
    _T.Q4_1: _split_q4_1,
    _T.Q5_0: _split_q5_0,
    _T.Q5_1: _split_q5_1,
    _T.Q4_K: _split_q4_k,
    _T.Q5_K: _split_q5_k,
    _T.Q6_K: _split_q6_k,
}
BLOCK_TYPES: tuple[GGMLQuantizationType, ...] = tuple(_SPLIT)
# NOTE: gguf-py also dequantizes NVFP4, which no kernel of ours runs; Q8_1 / Q8_K (llama.cpp's
# activation types, never a file's) it cannot.
REFERENCE_TYPES: tuple[GGMLQuantizationType, ...] = (
    _T.Q2_K, _T.Q3_K, _T.IQ4_NL, _T.IQ4_XS, _T.MXFP4, _T.TQ1_0, _T.TQ2_0, _T.IQ2_XXS, _T.IQ2_XS,
    _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S, _T.IQ1_S, _T.IQ1_M)
SUPPORTED_TYPES: tuple[str, ...] = tuple(
    t.name for t in (*_FLOAT_TYPES, *_SPLIT, *REFERENCE_TYPES))


def _dequantize_blocks(qtype: GGMLQuantizationType, b: torch.Tensor) -> torch.Tensor:
    return join_blocks(qtype, *_SPLIT[qtype](b))


def join_blocks(qtype: GGMLQuantizationType, codes: torch.Tensor,
                fields: dict[str, torch.Tensor]) -> torch.Tensor:
    """n blocks' codes (n, block) and fields (n, ...) as ``split_blocks`` has them (per block,
    not per row) → their weights (n, block) float32, ``scale * code + offset``: the very
    operations ``dequantize`` runs, so the same codes and fields give the same bits."""
    scale, offset = _scale_offset(qtype, fields)
    n, groups = scale.shape
    q = codes.reshape(n, groups, -1).float()
    return (q * scale[..., None] + offset[..., None]).reshape(n, -1)


def to_torch(data: np.ndarray | torch.Tensor) -> torch.Tensor:
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
    if qtype not in _FLOAT_TYPES and qtype not in _SPLIT and qtype not in REFERENCE_TYPES:
        raise ValueError(
            f"unsupported GGUF tensor type {name}; supported: {', '.join(SUPPORTED_TYPES)}"
        )

    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape, dtype=np.int64))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[-1] % block_size != 0:
        raise ValueError(f"{name}: last dim {shape[-1]} is not a multiple of {block_size}")
    raw = to_torch(data).reshape(-1).view(torch.uint8)
    expected = numel // block_size * type_size
    if raw.numel() != expected:
        raise ValueError(
            f"{name}: got {raw.numel()} bytes for shape {shape}, expected {expected}"
        )

    if qtype in _FLOAT_TYPES:
        out = raw.view(_FLOAT_TYPES[qtype])
        out = out.clone() if qtype == _T.F32 else out.float()
    elif qtype in REFERENCE_TYPES:
        out = _dequantize_reference(qtype, raw, shape[-1] if shape else block_size)
    else:
        out = _dequantize_blocks(qtype, raw.reshape(-1, type_size))
    return out.reshape(shape)


def _dequantize_reference(qtype: GGMLQuantizationType, raw: torch.Tensor, row: int
                          ) -> torch.Tensor:
    """gguf-py's numpy dequantizer on ``raw`` (bytes of whole rows of ``row`` values) → float32
    on ``raw``'s device, a fresh tensor. Fed rows, not blocks: gguf-py loops in Python over
    groups of 16 of whatever its input's rows are."""
    if not raw.numel():  # gguf-py cannot reshape nothing into blocks
        return torch.empty(0, device=raw.device)
    type_size = GGML_QUANT_SIZES[qtype][1]
    data = raw.cpu().numpy().reshape(-1, row // GGML_QUANT_SIZES[qtype][0] * type_size)
    out = torch.from_numpy(np.asarray(gguf_quants.dequantize(data, qtype), dtype=np.float32))
    return out.to(raw.device)


# -- blocks kept as they are (for the native block linear) ------------------------------------

def split_blocks(data: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType,
                 shape: tuple[int, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A quantized matrix of ``shape`` [N, K] → its codes [N, K] uint8 (unsigned: Q4_0's
    ``q``, Q8_0's ``q + 128``...) and its stored fields, each [N, K / block, ...] (f16 scales
    as float16, K-quants' sub-block scales as uint8 / int8), losslessly: ``dequantize`` is
    ``scale * code + offset`` of them. ValueError for a float type or bytes that do not fit."""
    qtype = GGMLQuantizationType(qtype)
    if qtype not in _SPLIT or len(shape) != 2:
        raise ValueError(f"not a block-quantized matrix: {qtype.name} {tuple(shape)}")
    n, k = (int(s) for s in shape)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = to_torch(data).reshape(-1).view(torch.uint8)
    if k % block_size or raw.numel() != n * k // block_size * type_size:
        raise ValueError(f"{qtype.name}: {raw.numel()} bytes do not hold a {n}x{k} matrix")
    codes, fields = _SPLIT[qtype](raw.reshape(-1, type_size))
    blocks = k // block_size
    return codes.reshape(n, k), {name: f.reshape(n, blocks, -1) for name, f in fields.items()}
