"""The packed layout of ``kernels/block_linear.cpp`` written in torch from ``split_blocks``'s
codes and fields: an independent statement of the layout that ``kernels/block_pack.cpp`` (the
loader's repack) must match byte for byte (tests/kernels/test_block_pack.py)."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from radixserve.layers.block_linear import K_QUANTS, QUANT_BITS, packed_bytes
from radixserve.layers.gguf_quant import split_blocks

_T = GGMLQuantizationType


def reference_pack(qtype: GGMLQuantizationType, raw: torch.Tensor, k: int) -> torch.Tensor:
    """GGUF bytes [N, bytes per row] -> the packed bytes, as block_pack.cpp writes them."""
    qtype = GGMLQuantizationType(qtype)
    codes, fields = split_blocks(raw, qtype, (raw.shape[0], k))
    out = _pack_rows(qtype, codes, fields)
    assert out.numel() == packed_bytes(qtype, raw.shape[0], k)
    return out


def _pack_rows(qtype: GGMLQuantizationType, codes: torch.Tensor,
               fields: dict[str, torch.Tensor]) -> torch.Tensor:
    """Codes [N, K] uint8 and fields [N, K / block, ...] → packed bytes (uint8 throughout)."""
    n, k = codes.shape
    u = 8 if qtype in K_QUANTS else 1
    n16, units = -(-n // 16), k // (32 * u)
    pad = n16 * 16 - n

    def rows16(t: torch.Tensor) -> torch.Tensor:  # [N, ...] → [n16, 16, ...], zero padded
        t = torch.cat((t, t.new_zeros((pad, *t.shape[1:])))) if pad else t
        return t.reshape(n16, 16, *t.shape[1:])

    # codes: (group, lane, unit, block, half, vector, byte) → (group, unit, block, vector,
    # lane, byte, half)
    c = rows16(codes).reshape(n16, 16, units, u, 2, 4, 4).permute(0, 2, 3, 5, 1, 6, 4)

    def nibble_plane(q: torch.Tensor) -> torch.Tensor:
        return ((q[..., 0] & 15) | (q[..., 1] & 15) << 4).reshape(n16, units, u, 256)

    def bit_plane(hb: torch.Tensor, vectors: range, width: int) -> torch.Tensor:
        """The high bits of ``vectors`` in one byte per (lane, byte): vector v's half h at bit
        width * (2 * (v - vectors.start) + h)."""
        out = torch.zeros_like(hb[:, :, :, 0, :, :, 0])
        for v in vectors:
            for h in range(2):
                out |= hb[:, :, :, v, :, :, h] << (width * (2 * (v - vectors.start) + h))
        return out.reshape(n16, units, u, 64)

    def lane_bytes(t: torch.Tensor) -> torch.Tensor:  # [N, blocks, w] → [n16, blocks, w, 16 x]
        return rows16(t).permute(0, 2, 3, 1).contiguous().view(torch.uint8)

    bits = QUANT_BITS[qtype]
    if bits == 8:  # the file's signed bytes (code - 128): a block's first 16 k, its second 16
        halves = [(c[..., h] ^ 0x80).reshape(n16, units, 256) for h in range(2)]
        scales = lane_bytes(fields["d"]).reshape(n16, units, 32)
        return torch.cat((*halves, scales), dim=-1).reshape(-1)
    pieces = [nibble_plane(c)]
    if bits == 5:  # bit 2v + h
        pieces.append(bit_plane((c >> 4) & 1, range(4), 1))
    elif bits == 6:  # vector v // 2, bits 2 * (2 * (v % 2) + h)
        hb = (c >> 4) & 3
        pieces.append(torch.cat((bit_plane(hb, range(0, 2), 2), bit_plane(hb, range(2, 4), 2)),
                                dim=-1))

    if qtype in K_QUANTS:
        if qtype == _T.Q6_K:  # two int8 scales per block of 32, halves after each other
            block = lane_bytes(fields["sc"])
        else:  # 6-bit scale and min of each block
            block = torch.stack((lane_bytes(fields["sc"]), lane_bytes(fields["mn"])), dim=3)
        pieces.append(block.reshape(n16, units, u, 32))
        names = ("d",) if qtype == _T.Q6_K else ("d", "dmin")
    else:
        names = ("d", "m") if "m" in fields else ("d",)
        pieces.append(torch.cat([lane_bytes(fields[nm]).reshape(n16, units, 1, 32)
                                 for nm in names], dim=-1))
        names = ()
    out = [p.reshape(n16, units, -1) for p in pieces]
    out += [lane_bytes(fields[nm]).reshape(n16, units, 32) for nm in names]
    return torch.cat(out, dim=-1).reshape(-1)

