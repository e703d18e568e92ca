"""The packed layout of the tile types (``block_linear.TILE_TYPES``), read back in torch: a
tied head's rows for the token embedding (``block_rows.gather_rows``) and the tests' reference.

A matrix is packed as ``[ceil(N / 16)][K / block]`` units of 16 rows' blocks; in a unit each
section of the block (``SECTIONS``: start byte, bytes, element size: the f16 ``d``, MXFP4's
exponent byte, 4-byte words for the rest) lies in turn, its elements interleaved across the 16
rows (element e of row r at 16 e + r), so one vector load takes the same word of every row
(``kernels/tile_decode.h``: Layout, the same table). A unit is exactly 16 blocks' bytes.
"""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_T = GGMLQuantizationType


def _sections(qtype: GGMLQuantizationType) -> tuple[tuple[int, int, int], ...]:
    size = GGML_QUANT_SIZES[qtype][1]
    if qtype in (_T.Q2_K, _T.IQ4_XS, _T.IQ1_M):
        return ((0, size, 4),)
    tail_d = {_T.Q3_K: 108, _T.TQ1_0: 52, _T.TQ2_0: 64}  # the f16 d last
    if qtype in tail_d:
        return ((0, tail_d[qtype], 4), (tail_d[qtype], 2, 2))
    if qtype == _T.MXFP4:
        return ((0, 1, 1), (1, 16, 4))
    return ((0, 2, 2), (2, size - 2, 4))  # the f16 d first


SECTIONS = {t: _sections(t) for t in (
    _T.Q2_K, _T.Q3_K, _T.IQ4_NL, _T.IQ4_XS, _T.MXFP4, _T.TQ1_0, _T.TQ2_0, _T.IQ2_XXS, _T.IQ2_XS,
    _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S, _T.IQ1_S, _T.IQ1_M)}


def unpack_rows(qtype: GGMLQuantizationType, packed: torch.Tensor, k: int,
                ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] of a packed matrix (uint8, k inputs a row) → their bytes as the file
    stores them, uint8 [T, k / block * block bytes]."""
    block, size = GGML_QUANT_SIZES[qtype]
    units = packed.view(-1, k // block, 16 * size)[ids // 16]  # [T, blocks, unit]
    lane, parts, at = ids % 16, [], 0
    for _, nbytes, elem in SECTIONS[qtype]:
        sec = units[..., at:at + 16 * nbytes].reshape(ids.shape[0], k // block, -1, 16, elem)
        parts.append(sec[torch.arange(ids.shape[0]), :, :, lane].reshape(ids.shape[0], -1, nbytes))
        at += 16 * nbytes
    return torch.cat(parts, dim=-1).reshape(ids.shape[0], -1)


def pack_reference(qtype: GGMLQuantizationType, raw: torch.Tensor) -> torch.Tensor:
    """The layout from a matrix's file bytes ``raw`` [N, row bytes], in torch (the tests'
    reference for the native pack): padding rows zero."""
    block, size = GGML_QUANT_SIZES[qtype]
    n, blocks = raw.shape[0], raw.shape[1] // size
    rows = torch.zeros(-(-n // 16) * 16, blocks, size, dtype=torch.uint8)
    rows[:n] = raw.reshape(n, blocks, size)
    groups = rows.view(-1, 16, blocks, size).transpose(1, 2)  # [N16, blocks, 16, size]
    parts = []
    for start, nbytes, elem in SECTIONS[qtype]:
        sec = groups[..., start:start + nbytes].reshape(*groups.shape[:2], 16, -1, elem)
        parts.append(sec.transpose(2, 3).reshape(*groups.shape[:2], -1))
    return torch.cat(parts, dim=-1).reshape(-1)
