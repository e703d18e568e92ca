"""Random GGUF rows of every block type we run: ``random_rows(qtype, n, k, seed)``.

gguf-py can quantize few of the types (none of the IQ ones, no K-quant), and a kernel test
wants every bit of every code and sub-block scale anyway: the rows are random bytes with only
the float fields (the f16 super-block scales, MXFP4's e8m0 exponent) overwritten by sane values,
so the weights ``gguf.quants.dequantize`` gives are finite, about 0.01 to 1 in size. Field
offsets follow gguf-py's ``quants.py`` (ggml's ``ggml-common.h``), one line per type below.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["BLOCK_TYPES", "random_rows"]

T = GGMLQuantizationType

# byte offsets of each block's f16 fields: d (a scale, positive here), then dmin / m where a
# type has one. The rest of a block is codes, signs and sub-block scales, left random.
_F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82),  # scales[16] qs[64] | d dmin
    T.Q3_K: (108,),  # hmask[32] qs[64] scales[12] | d
    T.Q4_K: (0, 2), T.Q5_K: (0, 2),  # d dmin | scales[12] (qh[32]) qs[128]
    T.Q6_K: (208,),  # ql[128] qh[64] scales[16] | d
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),  # d | (scales_h[2] scales_l[4]) qs
    T.TQ1_0: (52,),  # qs[48] qh[4] | d
    T.TQ2_0: (64,),  # qs[64] | d
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
    T.IQ1_S: (0,),  # d | ...
}
# How far a type's codes times its sub-block scales reach (|w| <= d * reach, from gguf-py's
# formulas: Q4_K's 63 * 15, IQ3_XXS's 7.75 * 62, IQ3_S's 31 * 15, Q8_0's 128 ...): d is drawn
# from [0.05, 1] / reach, so every type's largest weights land near 1 and typical ones well
# above 0.01. MXFP4 sets its exponent instead (below).
_REACH = {
    T.Q4_0: 8, T.Q4_1: 15, T.Q5_0: 16, T.Q5_1: 31, T.Q8_0: 128,
    T.Q2_K: 45, T.Q3_K: 128, T.Q4_K: 945, T.Q5_K: 1953, T.Q6_K: 4096,
    T.IQ4_NL: 127, T.IQ4_XS: 4064, T.TQ1_0: 1, T.TQ2_0: 2,
    T.IQ2_XXS: 168, T.IQ2_XS: 168, T.IQ2_S: 168, T.IQ3_XXS: 481, T.IQ3_S: 465,
    T.IQ1_S: 17, T.IQ1_M: 17, T.MXFP4: 12,
}
# the reach of the offset's scale: w = ... - dmin * min (K-quants' 6-bit mins, Q2_K's 4-bit),
# w = d * q + m (Q4_1, Q5_1: m stored negative, half the codes' reach)
_MIN_REACH = {T.Q4_1: -2, T.Q5_1: -2, T.Q2_K: 15, T.Q4_K: 63, T.Q5_K: 63}
BLOCK_TYPES: tuple[GGMLQuantizationType, ...] = tuple(_REACH)
_IQ1_M_SCALES = 48  # qs[32] qh[16] | scales: 4 uint16, d's 4 nibbles in their top bits


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_rows(qtype: GGMLQuantizationType, n: int, k: int, seed: int = 0,
                scale: float = 1.0) -> np.ndarray:
    """n rows of k weights of ``qtype`` as a GGUF file stores them: uint8 [n, k // block *
    type_size]. Random codes and sub-block scales; d an f16 drawn from [0.05, 1] * ``scale`` /
    the type's reach (about [1e-3, 2e-2] for a reach near 50), dmin / m alike, MXFP4's exponent
    byte 118..124 (a step of 2^-10 .. 2^-4 times codes up to 12) moved by log2(scale) rounded:
    the largest weights about ``scale``. ValueError for a type not listed or a k not a multiple
    of its block."""
    qtype = T(qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype not in _REACH or k % block:
        raise ValueError(f"no random rows of {qtype.name} x {k}")
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n * (k // block), size), dtype=np.uint8)
    d = rng.uniform(0.05, 1.0, len(blocks)) * scale / _REACH[qtype]
    if qtype == T.MXFP4:
        blocks[:, 0] = rng.integers(118, 125, len(blocks)) + round(np.log2(scale))
    elif qtype == T.IQ1_M:
        scales = blocks[:, _IQ1_M_SCALES:].copy().view(np.uint16)  # [blocks, 4]
        bits = d.astype(np.float16).view(np.uint16)
        for i in range(4):  # nibble i of d in the top bits of scale i
            scales[:, i] = (scales[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        blocks[:, _IQ1_M_SCALES:] = scales.view(np.uint8)
    else:
        fields = _F16_FIELDS[qtype]
        blocks[:, fields[0]:fields[0] + 2] = _f16_bytes(d)
        if len(fields) > 1:
            dmin = rng.uniform(0.05, 1.0, len(blocks)) * scale / _MIN_REACH[qtype]
            blocks[:, fields[1]:fields[1] + 2] = _f16_bytes(dmin)
    return blocks.reshape(n, -1)
