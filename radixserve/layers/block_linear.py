"""Block-quantized linear layer for CPUs: a GGUF file's quantized matrices as the file stores them.

``y = x @ W.T + bias`` where every matrix of the layer keeps its file type (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): the weights are exactly the file's and take about its bytes
(the packed layout adds ~0.1 bit per weight to the K-quants, none to the others). A fused
layer (q/k/v, gate/up) whose matrices differ in type — Q4_K_M files store some as Q6_K — keeps
one part per type, side by side in the output.

The activations are quantized per row and block of 32 to 8 bits (llama.cpp's Q8_1); the integer
sum of each sub-block is exact and the float accumulation runs block by block in one fixed order, so a
row's output is bit-identical alone or in any batch. The numerics and the packed layout are
stated in ``kernels/block_linear.cpp``; ``pack`` here writes that layout from the file's bytes
(through ``layers/gguf_quant.split_blocks``).

F16 and BF16 matrices (GGUF's, or a safetensors folder's float16 / bfloat16 weights) are part
types too: their 16-bit values are kept as they are and multiplied by float32 activations (no
8-bit rounding), widened in registers (``kernels/half_linear.cpp``), packed as
``[ceil(N / 16)][K][16]`` 16-bit elements (16 outputs' weights at each k side by side, padding
outputs zero): exactly 2 bytes a weight, any K. A row's output is the plain sum over k in order,
bit-identical in any batch as well.

It exists only where the native kernels load (``models/quantization.py`` keeps float weights
elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from radixserve.kernels import native, ops
from radixserve.layers.gguf_quant import split_blocks

_T = GGMLQuantizationType
# the kernel's format ids (block_linear.cpp: Format)
FORMATS = {_T.Q4_0: 0, _T.Q4_1: 1, _T.Q5_0: 2, _T.Q5_1: 3, _T.Q8_0: 4, _T.Q4_K: 5, _T.Q5_K: 6,
           _T.Q6_K: 7, _T.F16: 8, _T.BF16: 9}
HALF_TYPES = (_T.F16, _T.BF16)  # 16-bit parts: float32 activations, any K
K_QUANTS = (_T.Q4_K, _T.Q5_K, _T.Q6_K)
QUANT_BITS = {_T.Q4_0: 4, _T.Q4_1: 4, _T.Q4_K: 4, _T.Q5_0: 5, _T.Q5_1: 5, _T.Q5_K: 5, _T.Q6_K: 6,
         _T.Q8_0: 8}


class BlockLinear(nn.Module):
    """``x`` [M, in_features] (any float dtype) → [M, out_features] in ``x``'s dtype. Build it
    with ``from_blocks`` (None where the native kernels do not load)."""

    def __init__(self, parts: Sequence[tuple[GGMLQuantizationType, torch.Tensor]],
                 in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = sum(raw.shape[0] for _, raw in parts)
        self.types = tuple(qtype.name for qtype, _ in parts)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        packed = []
        for i, (qtype, raw) in enumerate(parts):
            packed.append((FORMATS[qtype], pack(qtype, raw, in_features), raw.shape[0]))
            self.register_buffer(f"packed{i}", packed[-1][1])
        self._native = ops.BlockWeight(packed, in_features, self.bias)  # the kernel's parts

    @classmethod
    def from_stored(cls, parts: Sequence[tuple[GGMLQuantizationType, torch.Tensor]],
                    in_features: int, bias: torch.Tensor | None = None) -> BlockLinear | None:
        """``parts``: (file type, the matrix's GGUF bytes [n_i, bytes per row] uint8, rows in
        output order) per matrix stacked in the layer; consecutive parts of one type are packed
        as one. ValueError on types or shapes that do not fit."""
        if not parts:
            raise ValueError("a block linear needs at least one matrix")
        k = in_features
        merged: list[tuple[GGMLQuantizationType, torch.Tensor]] = []
        for qtype, raw in parts:
            qtype = GGMLQuantizationType(qtype)
            if qtype not in FORMATS:
                raise ValueError(f"no block kernel for {qtype.name}; "
                                 f"supported: {[t.name for t in FORMATS]}")
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if qtype not in HALF_TYPES and (k % (256 if qtype in K_QUANTS else 32)
                                             or k % block_size):
                raise ValueError(f"{qtype.name} needs the input size to be a multiple of its "
                                 f"block, got {k}")
            row_bytes = k // block_size * type_size
            if raw.dim() != 2 or raw.dtype != torch.uint8 or raw.shape[1] != row_bytes:
                raise ValueError(f"{qtype.name} rows of {tuple(raw.shape)} {raw.dtype} do not "
                                 f"hold {k} weights each")
            if merged and merged[-1][0] == qtype:
                merged[-1] = (qtype, torch.cat((merged[-1][1], raw)))
            else:
                merged.append((qtype, raw))
        return None if native.load() is None else cls(merged, k, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ops.block_linear(x.float().contiguous(), self._native)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, blocks={'+'.join(self.types)}")


def packed_bytes(qtype: GGMLQuantizationType, n: int, k: int) -> int:
    """The bytes ``pack`` gives for an n x k matrix of ``qtype`` (the loader's accounting)."""
    qtype = GGMLQuantizationType(qtype)
    if qtype in HALF_TYPES:
        return -(-n // 16) * 16 * k * 2
    u = 8 if qtype in K_QUANTS else 1
    bits = QUANT_BITS[qtype]
    plane = {4: 0, 5: 64, 6: 128, 8: 256}[bits]
    per_block = 64 if qtype in (_T.Q4_1, _T.Q5_1) else 32
    per_unit = 32 if qtype == _T.Q6_K else 64 if qtype in K_QUANTS else 0
    return -(-n // 16) * (k // (32 * u)) * (u * (256 + plane + per_block) + per_unit)


PACK_ROWS = 2048  # rows split and packed at a time: bounds the load's transient memory


def pack(qtype: GGMLQuantizationType, raw: torch.Tensor, k: int) -> torch.Tensor:
    """A matrix's GGUF bytes ``raw`` [N, bytes per row] (rows in output order) → the kernel's
    packed bytes (the layout in ``kernels/block_linear.cpp``), uint8 [packed_bytes(qtype, N,
    k)], through ``gguf_quant.split_blocks`` a few thousand rows at a time."""
    qtype = GGMLQuantizationType(qtype)
    n = raw.shape[0]
    out = torch.empty(packed_bytes(qtype, n, k), dtype=torch.uint8)
    if qtype in HALF_TYPES:
        return _pack_half(raw, k, out)
    per_group = packed_bytes(qtype, 16, k)
    for r0 in range(0, n, PACK_ROWS):
        r1 = min(n, r0 + PACK_ROWS)
        codes, fields = split_blocks(raw[r0:r1], qtype, (r1 - r0, k))
        chunk = _pack_rows(qtype, codes, fields)
        out[r0 // 16 * per_group:r0 // 16 * per_group + chunk.numel()] = chunk
    return out


def _pack_half(raw: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """16-bit rows [N, 2K] (their bytes) → ``out`` as [N16][K][16] elements, the bits as they
    are: whole groups written in place, the last one zero padded."""
    n = raw.shape[0]
    rows = raw.contiguous().view(torch.int16)  # [N, K], no copy of a contiguous matrix
    groups = out.view(torch.int16).view(-1, k, 16)
    whole = n // 16
    if whole:
        groups[:whole].copy_(rows[:whole * 16].view(whole, 16, k).transpose(1, 2))
    if n % 16:
        tail = rows.new_zeros(16, k)
        tail[:n % 16] = rows[whole * 16:]
        groups[whole].copy_(tail.T)
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

