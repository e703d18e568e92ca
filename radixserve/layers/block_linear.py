"""Block-quantized linear layer for CPUs: a GGUF file's quantized matrices as the file stores them.

``y = x @ W.T + bias`` where every matrix of the layer keeps its file type (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): the weights are exactly the file's and take about its bytes
(the packed layout adds ~0.1 bit per weight to the K-quants, none to the others). A fused
layer (q/k/v, gate/up) whose matrices differ in type — Q4_K_M files store some as Q6_K — keeps
one part per type, side by side in the output.

The activations are quantized per row to 8 bits: for the legacy types per block of 32 (llama.cpp's
Q8_1), for the K-quants with one step per super-block of 256 and a power-of-two fraction of it per
block (their sub-block scales then fold into exact integer sums over the super-block: one float step
per 256 weights). The integer sums are exact and the float accumulation runs in one fixed order, so
a row's output is bit-identical alone or in any batch. The numerics and the packed layout are
stated in ``kernels/block_linear.cpp``; ``pack`` writes that layout from the file's bytes
(``kernels/block_pack.cpp``; ``tests/block_pack_reference.py`` is the same in numpy).

F16 and BF16 matrices (GGUF's, or a safetensors folder's float16 / bfloat16 weights) are part
types too: their 16-bit values are kept as they are and multiplied by float32 activations (no
8-bit rounding), widened in registers (``kernels/half_linear.cpp``), packed as
``[ceil(N / 16)][K][16]`` 16-bit elements (16 outputs' weights at each k side by side, padding
outputs zero): exactly 2 bytes a weight, any K. A row's output is the plain sum over k in order,
bit-identical in any batch as well.

The other GGUF types (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: ``TILE_TYPES``) keep the file's blocks byte for byte, regrouped
16 rows at a time; one kernel decodes a group of 16 outputs to an int8 tile and multiplies every
row of a batch with it (``kernels/tile_linear.cpp``: the numerics and why rows stay batch
invariant).

It exists only where the native kernels load (``models/quantization.py`` keeps float weights
elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from radixserve.kernels import native, ops

_T = GGMLQuantizationType
# the kernel's format ids (block_linear.cpp: Format)
FORMATS = {_T.Q4_0: 0, _T.Q4_1: 1, _T.Q5_0: 2, _T.Q5_1: 3, _T.Q8_0: 4, _T.Q4_K: 5, _T.Q5_K: 6,
           _T.Q6_K: 7, _T.F16: 8, _T.BF16: 9}
HALF_TYPES = (_T.F16, _T.BF16)  # 16-bit parts: float32 activations, any K
# the types decoded to int8 tiles by one kernel (kernels/tile_linear.cpp), ids from 10 on
TILE_TYPES = (_T.Q2_K, _T.Q3_K, _T.IQ4_NL, _T.IQ4_XS, _T.MXFP4, _T.TQ1_0, _T.TQ2_0, _T.IQ2_XXS,
              _T.IQ2_XS, _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S, _T.IQ1_S, _T.IQ1_M)
FORMATS.update({t: 10 + i for i, t in enumerate(TILE_TYPES)})
_TILE_NAMES = {t.name for t in TILE_TYPES}
_SUB16_NAMES = {"Q2_K", "Q3_K", "IQ2_XS", "IQ2_S", "IQ1_M"}  # scales per 16 weights
# the levels whose tile decoders run in vector registers (kernels/tile_simd.h); the others
# decode row by row (kernels/tile_decode.h)
VECTOR_TILE_LEVELS = ("amx", "avx512", "avxvnni", "avx2")


def tile_note(types: Sequence[str], level: str | None) -> str:
    """How the tile types among ``types`` (type names) run at kernel ``level``: '' where none
    is one, else a clause for the start-up line and ``radixserve env``."""
    tiles = [t for t in types if t in _TILE_NAMES]
    if not tiles:
        return ""
    how = ("decoded in vector registers" if level in VECTOR_TILE_LEVELS
           else f"decoded row by row (no vector decoder at the {level} level: slower)")
    by_amx = [t for t in tiles if t not in _SUB16_NAMES]  # tile_linear.cpp: item_groups
    amx = (f", AMX tile products for many rows ({', '.join(by_amx)})"
           if level == "amx" and by_amx else "")
    return f"; {', '.join(tiles)} through int8 tiles {how}{amx}"
K_QUANTS = (_T.Q4_K, _T.Q5_K, _T.Q6_K)
QUANT_BITS = {_T.Q4_0: 4, _T.Q4_1: 4, _T.Q4_K: 4, _T.Q5_0: 5, _T.Q5_1: 5, _T.Q5_K: 5, _T.Q6_K: 6,
         _T.Q8_0: 8}


class Repack:
    """Where a load gets each matrix's packed bytes: packed now (this class, the null store),
    or read from a cache of an earlier load's (models/packed_cache.py)."""

    def packed(self, name: str, qtype: GGMLQuantizationType, raws: Sequence[torch.Tensor],
               k: int) -> torch.Tensor:
        """The packed bytes of the matrices ``raws`` (rows stacked, GGUF bytes of ``qtype``,
        ``k`` columns), known as ``name`` (the tensors they come from)."""
        return pack(qtype, raws, k)

    def save_when_idle(self) -> None:
        """Keep what this load packed, where the store does (on a thread of its own)."""

    def loaded(self) -> str:
        """What the load took from the store, for the start-up log ('' for nothing)."""
        return ""


REPACK = Repack()


class BlockLinear(nn.Module):
    """``x`` [M, in_features] (any float dtype) → [M, out_features] in ``x``'s dtype. Build it
    with ``from_blocks`` (None where the native kernels do not load)."""

    def __init__(self, parts: Sequence[tuple[GGMLQuantizationType, Sequence[torch.Tensor]]],
                 in_features: int, bias: torch.Tensor | None, packs: Repack = REPACK,
                 name: str = "") -> None:
        """``parts``: (file type, its matrices' GGUF bytes, rows stacked in output order) per
        part, one part per run of matrices of one type; ``packs`` gives each part's packed
        bytes, as ``name#i`` (``name``: the layer's tensors)."""
        super().__init__()
        self.in_features = in_features
        rows = [sum(raw.shape[0] for raw in raws) for _, raws in parts]
        self.out_features = sum(rows)
        self.types = tuple(qtype.name for qtype, _ in parts)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        packed = []
        for i, ((qtype, raws), n) in enumerate(zip(parts, rows)):
            packed.append((FORMATS[qtype], packs.packed(f"{name}#{i}", qtype, raws,
                                                        in_features), n))
            self.register_buffer(f"packed{i}", packed[-1][1])
        self._native = ops.BlockWeight(packed, in_features, self.bias)  # the kernel's parts

    @classmethod
    def from_stored(cls, parts: Sequence[tuple[GGMLQuantizationType, torch.Tensor]],
                    in_features: int, bias: torch.Tensor | None = None,
                    packs: Repack = REPACK, name: str = "") -> BlockLinear | None:
        """``parts``: (file type, the matrix's GGUF bytes [n_i, bytes per row] uint8, rows in
        output order) per matrix stacked in the layer; consecutive parts of one type are packed
        as one, by ``packs`` (the matrices known together as ``name``: a cache's key, unique
        per layer of one file). ValueError on types or shapes that do not fit."""
        if not parts:
            raise ValueError("a block linear needs at least one matrix")
        k = in_features
        merged: list[tuple[GGMLQuantizationType, list[torch.Tensor]]] = []
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
                merged[-1][1].append(raw)
            else:
                merged.append((qtype, [raw]))
        return None if native.load() is None else cls(merged, k, bias, packs, name)

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
    if qtype in TILE_TYPES:  # the file's blocks, 16 rows at a time
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        return -(-n // 16) * 16 * (k // block_size) * type_size
    u = 8 if qtype in K_QUANTS else 1
    bits = QUANT_BITS[qtype]
    plane = {4: 0, 5: 64, 6: 128, 8: 256}[bits]
    per_block = 64 if qtype in (_T.Q4_1, _T.Q5_1) else 32
    per_unit = 32 if qtype == _T.Q6_K else 64 if qtype in K_QUANTS else 0
    return -(-n // 16) * (k // (32 * u)) * (u * (256 + plane + per_block) + per_unit)


def pack(qtype: GGMLQuantizationType, raw: torch.Tensor | Sequence[torch.Tensor],
         k: int) -> torch.Tensor:
    """A matrix's GGUF bytes ``raw`` [N, bytes per row] (rows in output order), or several
    matrices of this type whose rows stack, → the kernel's packed bytes (the layout in
    ``kernels/block_linear.cpp``; tile types: the file's blocks as
    [ceil(N / 16)][K / block][16 rows][block bytes], ``kernels/tile_linear.cpp``), uint8
    [packed_bytes(qtype, N, k)]: block formats by the native repack (``kernels/block_pack.cpp``),
    16-bit ones here. Every layout is groups of 16 rows one after another, so stacked matrices
    are packed one by one into their groups' place (no copy of their concatenation) where each
    but the last fills whole groups."""
    qtype = GGMLQuantizationType(qtype)
    raws = [raw] if isinstance(raw, torch.Tensor) else list(raw)
    out = torch.empty(packed_bytes(qtype, sum(r.shape[0] for r in raws), k), dtype=torch.uint8)
    if any(r.shape[0] % 16 for r in raws[:-1]):  # a group of 16 rows would hold two of them
        raws = [torch.cat(raws)]
    start = 0
    for r in raws:
        end = start + packed_bytes(qtype, r.shape[0], k)
        if qtype in HALF_TYPES:
            _pack_half(r, k, out[start:end])
        else:
            ops.block_pack(FORMATS[qtype], r, k, out[start:end])
        start = end
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
