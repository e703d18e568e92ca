"""Rows of a `BlockLinear`'s packed matrix read back as weights: the token embedding of a model
whose head is tied to it, so the table is stored once (the head's packed blocks) instead of
twice (those plus the file's rows for the lookup).

``gather_rows`` inverts ``block_linear.pack`` for the rows asked for only: one gather takes each
id's own bytes out of its group of 16 outputs (the layout in ``kernels/block_linear.cpp``; the
offsets of each lane's bytes are worked out once per type and width), then the row's codes and
fields are rebuilt as ``split_blocks`` has them and joined with ``gguf_quant.join_blocks``, the
operations ``dequantize`` runs, so a row's values are bit-identical to the file's row
dequantized. 16-bit parts give their values as stored, widened to float32 (what ``dequantize``
and ``Tensor.float`` give). The tile types (``TILE_TYPES``: Q2_K, Q3_K, the IQ types, MXFP4,
TQ*) keep the file's own bytes, 16 rows' blocks at a time with their fields interleaved
(``tile_layout.py``): a row's blocks are taken back out of its units and dequantized as the
file's row would be.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType
from torch import nn

from radixserve.layers.block_linear import (HALF_TYPES, K_QUANTS, QUANT_BITS, TILE_TYPES,
                                            BlockLinear, packed_bytes)
from radixserve.layers.gguf_quant import dequantize, join_blocks
from radixserve.layers.tile_layout import unpack_rows

_T = GGMLQuantizationType
_HALF_DTYPES = {_T.F16: torch.float16, _T.BF16: torch.bfloat16}


class PackedEmbedding(nn.Module):
    """Token embedding on a tied head's packed rows: ``ids`` [T] → [T, dim] float32, each row
    exactly the stored row dequantized. Holds the head's buffer itself (no copy)."""

    def __init__(self, head: BlockLinear) -> None:
        super().__init__()
        if len(head.types) != 1:
            raise ValueError(f"a packed embedding reads one part, the head has {head.types}")
        self.register_buffer("packed", head.packed0)  # the head's storage, shared
        self.qtype = _T[head.types[0]]
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return gather_rows(self.qtype, self.packed, self.embedding_dim, ids.reshape(-1))

    @property
    def weight(self) -> torch.Tensor:
        """The whole table in float32 (tests and the torch paths only: a full copy), gathered
        a few thousand rows at a time (the offsets of a whole 262k-row table would take GBs)."""
        ids = torch.arange(self.num_embeddings)
        return torch.cat([self(chunk) for chunk in ids.split(4096)])

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, the head's packed "
                f"{self.qtype.name} rows")


def gather_rows(qtype: GGMLQuantizationType, packed: torch.Tensor, k: int,
                ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` [T] of the matrix ``pack`` wrote as ``packed`` (k inputs a row) → [T, k]
    float32, bit-identical to ``dequantize`` of those rows' file bytes."""
    qtype = GGMLQuantizationType(qtype)
    ids = ids.to(torch.long)
    if not ids.numel():
        return torch.empty(0, k)
    if qtype in HALF_TYPES:  # [N16][K][16] 16-bit elements
        rows = packed.view(torch.int16).view(-1, k, 16)[ids // 16, :, ids % 16]
        return rows.view(_HALF_DTYPES[qtype]).float()
    if qtype in TILE_TYPES:  # units of 16 rows' blocks, their fields interleaved
        return dequantize(unpack_rows(qtype, packed, k, ids), qtype, (ids.shape[0], k))
    layout = _layout(qtype, k)
    # one gather: each id's own bytes of its group, [units][sections without the lane]
    picked = packed[(ids // 16 * layout.group_bytes)[:, None] + layout.lane_bytes[ids % 16]]
    sections = picked.view(ids.shape[0], layout.units, -1).split(layout.sizes, dim=-1)
    codes, fields = _decode(qtype, [s.contiguous() for s in sections], layout.u)
    blocks = ids.shape[0] * layout.units  # a unit is one block of the file's type
    weights = join_blocks(qtype, codes.reshape(blocks, -1),
                          {name: f.reshape(blocks, -1) for name, f in fields.items()})
    return weights.reshape(ids.shape[0], k)


@dataclass(frozen=True)
class _Layout:
    """Where a row's bytes lie in its group of 16: ``lane_bytes[lane]`` the offsets (in the
    group's ``group_bytes``) of lane ``lane``'s bytes, unit after unit, each unit's sections
    (``sizes`` bytes each) in order, a section's bytes in its order without the lane dim."""

    u: int
    units: int
    group_bytes: int
    sizes: tuple[int, ...]
    lane_bytes: torch.Tensor  # [16, row bytes] int64


def _sections(qtype: GGMLQuantizationType, u: int) -> list[tuple[int, tuple[int, ...], int]]:
    """A unit's sections in order, (bytes, shape, the shape's lane dim), as ``pack`` writes
    them (``kernels/block_linear.cpp``): codes, high bits, per-block fields, per-unit fields."""
    bits, k_quant = QUANT_BITS[qtype], qtype in K_QUANTS
    if bits == 8:  # signed bytes: [block][half][vector][lane][byte]
        out = [(u * 512, (u, 2, 4, 16, 4), 3)]
    else:  # low nibbles (half 0) | high nibbles (half 1): [block][vector][lane][byte]
        out = [(u * 256, (u, 4, 16, 4), 2)]
    if bits == 5:
        out.append((u * 64, (u, 16, 4), 1))
    elif bits == 6:  # two planes, vectors 0-1 and 2-3
        out.append((u * 128, (u, 2, 16, 4), 2))
    if not k_quant:  # f16 d [and m]
        names = 2 if qtype in (_T.Q4_1, _T.Q5_1) else 1
        return out + [(names * 32, (names, 16, 2), 1)]
    out.append((u * 32, (u, 2, 16), 2))  # per block: (scale, min) or Q6_K's two scales
    names = 1 if qtype == _T.Q6_K else 2  # f16 d [and dmin]
    return out + [(names * 32, (names, 16, 2), 1)]


@functools.lru_cache(maxsize=None)
def _layout(qtype: GGMLQuantizationType, k: int) -> _Layout:
    u = 8 if qtype in K_QUANTS else 1
    units = k // (32 * u)
    group_bytes = packed_bytes(qtype, 16, k)
    unit_bytes = group_bytes // units
    lanes, start = [], 0
    for size, shape, at in _sections(qtype, u):
        where = torch.arange(start, start + size).reshape(shape).movedim(at, 0)
        lanes.append(where.reshape(16, -1))
        start += size
    assert start == unit_bytes, (qtype, start, unit_bytes)
    per_unit = torch.cat(lanes, dim=1)  # [16, a unit's bytes of one lane]
    offsets = torch.arange(units)[None, :, None] * unit_bytes + per_unit[:, None, :]
    return _Layout(u, units, group_bytes, tuple(t.shape[1] for t in lanes),
                   offsets.reshape(16, -1))


def _decode(qtype: GGMLQuantizationType, sections: list[torch.Tensor], u: int
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rows' sections, each [T, units, bytes] → their codes [T, units, u, half, vector, byte]
    (weight 32b + 16h + 4v + i of a unit's block b) and their fields per unit, as
    ``split_blocks`` names them (f16 scales as float16 [T, units, 1], K-quants' sub-block
    scales [T, units, 8 or 16])."""
    t, units = sections[0].shape[:2]
    bits = QUANT_BITS[qtype]
    if bits == 8:  # the file's int8 + 128
        codes = sections[0].view(t, units, u, 2, 4, 4) ^ 0x80
    else:
        nib = sections[0].view(t, units, u, 4, 4)
        codes = torch.stack((nib & 15, nib >> 4), dim=3)
    if bits == 5:  # bit 2v + h of the lane's byte i
        hb = sections[1].view(t, units, u, 1, 1, 4)
        shift = (2 * torch.arange(4)[None, :] + torch.arange(2)[:, None]).to(torch.uint8)
        codes |= ((hb >> shift[..., None]) & 1) << 4
    elif bits == 6:  # vector v in plane v // 2, at bits 2 * (2 * (v % 2) + h)
        hb = sections[1].view(t, units, u, 2, 4).repeat_interleave(2, dim=3)[:, :, :, None]
        v, h = torch.arange(4)[None, :], torch.arange(2)[:, None]
        shift = (2 * (2 * (v % 2) + h)).to(torch.uint8)
        codes |= ((hb >> shift[..., None]) & 3) << 4
    halves = sections[-1].view(torch.float16)  # [T, units, names]
    if qtype not in K_QUANTS:
        names = ("d", "m") if qtype in (_T.Q4_1, _T.Q5_1) else ("d",)
        return codes, {name: halves[..., i:i + 1] for i, name in enumerate(names)}
    per_block = sections[-2].view(t, units, u, 2)
    if qtype == _T.Q6_K:  # two int8 scales per block of 32, in order
        return codes, {"d": halves[..., :1], "sc": per_block.reshape(t, units, 16)
                       .view(torch.int8)}
    return codes, {"d": halves[..., :1], "dmin": halves[..., 1:2],
                   "sc": per_block[..., 0], "mn": per_block[..., 1]}
