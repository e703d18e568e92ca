"""Numpy quantizers for GGUF's K-quant formats Q4_K, Q5_K and Q6_K.

The installed ``gguf`` package can dequantize these types but not quantize them; tests and
benchmarks need them to build realistic (Q4_K_M-like) GGUF files from float weights.
:func:`quantize_k` writes ggml's block bytes (``ggml-common.h``), so ``gguf.quants.dequantize``
and ``radixserve.layers.gguf_quant.dequantize`` decode them. Super-blocks hold QK_K = 256 values:

* Q4_K (144 bytes): f16 ``d``, f16 ``dmin``, 12 bytes of eight packed 6-bit (scale, min) pairs,
  128 bytes of nibbles; weight = d * sc * q - dmin * m, q in 0..15, per sub-block of 32.
* Q5_K (176 bytes): as Q4_K plus 32 bytes ``qh`` (after the scales, before the nibbles) holding
  each code's 5th bit; q in 0..31.
* Q6_K (210 bytes): 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales (one per 16
  values), f16 ``d`` last; weight = d * sc * (q - 32), q in 0..63.

The quantizer is the simple one-pass min/max kind, vectorised over all blocks, not llama.cpp's
iterative error search: its error is somewhat larger than llama.cpp's, its layout identical.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf import quants as gq

__all__ = ["K_TYPES", "quantize", "quantize_k"]

_T = GGMLQuantizationType
K_TYPES = (_T.Q4_K, _T.Q5_K, _T.Q6_K)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, and 0 where b == 0."""
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32),
                     where=b != 0)


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x rounded to f16 as float32, its 2 little-endian bytes per value), x of shape (n,)."""
    h = x.astype(np.float16)
    return h.astype(np.float32), h.view(np.uint8).reshape(-1, 2)


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins per block, (n, 8) each -> (n, 12) bytes (``get_scale_min_k4``).

    Sub-blocks 0-3 sit in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7
    keep their low 4 bits in bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits
    in the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
    """
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]
    lo_mn, hi_mn = mn[:, :4], mn[:, 4:]
    return np.concatenate([lo_sc | ((hi_sc >> 4) << 6),
                           lo_mn | ((hi_mn >> 4) << 6),
                           (hi_sc & 0x0F) | ((hi_mn & 0x0F) << 4)], axis=1)


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes -> (n, 128) bytes: byte chunk j holds sub-block 2j low, 2j+1 high."""
    q = q.reshape(-1, 4, 2, 32) & 0x0F
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _quantize_scale_min(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Shared Q4_K/Q5_K step, blocks (n, 256) float32 -> (codes (n, 256) uint8, header (n, 16)).

    Per sub-block of 32: offset m = max(0, -min), scale = (max + m) / (2^bits - 1); the scales
    and offsets become 6-bit multiples of the f16 super-block d = max scale / 63 and dmin =
    max m / 63, and the codes are computed against those rounded values. A sub-block with any
    range keeps a scale of at least 1, so one dwarfed by another sub-block's outlier is coded
    coarsely rather than collapsed onto its offset.
    """
    nmax = (1 << bits) - 1
    sub = blocks.reshape(-1, 8, 32)
    offset = np.maximum(0.0, -sub.min(axis=-1))
    scale = (sub.max(axis=-1) + offset) / nmax
    d, d_bytes = _f16(scale.max(axis=-1) / 63)
    dmin, dmin_bytes = _f16(offset.max(axis=-1) / 63)
    sc = (np.clip(np.rint(_div(scale, d[:, None])), 1, 63) * (scale > 0)).astype(np.uint8)
    mn = np.clip(np.rint(_div(offset, dmin[:, None])), 0, 63).astype(np.uint8)
    step = (d[:, None] * sc)[..., None]
    base = (dmin[:, None] * mn)[..., None]
    codes = np.clip(np.rint(_div(sub + base, step)), 0, nmax).astype(np.uint8)
    header = np.concatenate([d_bytes, dmin_bytes, _pack_scale_min_k4(sc, mn)], axis=1)
    return codes.reshape(-1, QK_K), header


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    codes, header = _quantize_scale_min(blocks, 4)
    return np.concatenate([header, _nibble_pairs(codes)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    codes, header = _quantize_scale_min(blocks, 5)
    # bit i of qh[l] is the 5th bit of element l of sub-block i
    high = codes.reshape(-1, 8, 32) >> 4
    qh = (high << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1, dtype=np.uint8)
    return np.concatenate([header, qh, _nibble_pairs(codes)], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """Per 16 values: scale = (the value of largest magnitude) / -32, so it lands on code 0
    (-32, the wider side of -32..31); int8 scales are multiples of the f16 d = max |scale| / 127,
    at least 1 in magnitude where the 16 values are not all zero (as for Q4_K's scales).
    """
    sub = blocks.reshape(-1, 16, 16)
    extreme = np.take_along_axis(sub, np.abs(sub).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scale = extreme / -32
    d, d_bytes = _f16(np.abs(scale).max(axis=-1) / 127)
    magnitude = np.clip(np.rint(_div(np.abs(scale), d[:, None])), 1, 127)
    sc = (np.sign(scale) * magnitude).astype(np.int8)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(_div(sub, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    # each 128-value half (32-groups k = 0..3): 64 ql bytes, the low nibbles of groups 0 and 1
    # in order, with those of groups 2 and 3 as their high nibbles ...
    lo = (q & 0x0F).reshape(-1, 2, 2, 64)
    ql = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    # ... and 32 bytes of high 2-bit pairs, 32-group k at bits 2k
    hi = q >> 4
    qh = (hi << np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]).sum(axis=2, dtype=np.uint8)
    return np.concatenate([ql, qh.reshape(-1, 64), sc.view(np.uint8), d_bytes], axis=1)


_QUANTIZERS = {_T.Q4_K: _q4_k, _T.Q5_K: _q5_k, _T.Q6_K: _q6_k}


def quantize_k(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """w float32 [..., K] with K % 256 == 0 -> uint8 [..., K // 256 * type_size] (ggml block bytes).

    ``qtype`` is Q4_K, Q5_K or Q6_K. ``w`` must be finite, and small enough that the f16
    super-block scales stay finite (|w| below about 4e6 for Q4_K/Q5_K, 2.6e8 for Q6_K). An
    all-zero block encodes exactly zero.
    """
    w = np.asarray(w, dtype=np.float32)
    if qtype not in _QUANTIZERS:
        raise ValueError(f"not a K-quant type: {qtype!r}; expected one of {K_TYPES}")
    if w.ndim == 0 or w.shape[-1] % QK_K:
        raise ValueError(f"last dimension of shape {w.shape} is not a multiple of {QK_K}")
    type_size = GGML_QUANT_SIZES[qtype][1]
    out = _QUANTIZERS[qtype](w.reshape(-1, QK_K))
    return out.reshape(*w.shape[:-1], w.shape[-1] // QK_K * type_size)


def quantize(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """GGUF tensor data of ``w`` at ``qtype``: K-quants via :func:`quantize_k`, every other type
    via ``gguf.quants.quantize`` (which raises NotImplementedError for types it lacks)."""
    if qtype in _QUANTIZERS:
        return quantize_k(w, qtype)
    return gq.quantize(w, qtype)
