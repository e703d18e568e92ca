"""The tile types as stored (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: kernels/tile_linear.cpp), every one at every CPU level
built here: the kernel against gguf-py's dequantized weights on odd shapes, rows bit-identical
alone or in any batch, layers mixing them with the block types, the packed layout and its rows
read back as an embedding. Weights are random rows (gguf_blocks.py): gguf-py quantizes none of
these types but dequantizes them all, and random codes and sub-block scales reach every bit."""

from __future__ import annotations

import functools

import gguf
import numpy as np
import pytest
import torch
from gguf_blocks import BLOCK_TYPES, random_rows

from radixserve.kernels import native
from radixserve.layers.block_linear import FORMATS, TILE_TYPES, BlockLinear, pack, packed_bytes
from radixserve.layers.tile_layout import pack_reference, unpack_rows
from radixserve.layers.block_rows import PackedEmbedding, gather_rows
from radixserve.layers.gguf_quant import REFERENCE_TYPES, dequantize

T = gguf.GGMLQuantizationType
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
every_level = pytest.mark.usefixtures("kernel_level")  # every CPU level built here
# activations in 8 bits per block of 32 (llama.cpp's Q8_1), as test_block_linear.py's legacy
# types: of the output's range
REL_TOL = 1.5e-2
# against the product of the rounded activations themselves (tile_linear.cpp's numerics, the
# same float32 steps rounding x here): only the float steps' rounding remains, measured
# <= 5e-7 of sum |x| |w| (bias added and taken off); one code or sub-block scale off by one in
# one row moves it 4e-4 to 3e-3
EXACT_TOL = 2e-5


def _block(qtype) -> int:
    return gguf.GGML_QUANT_SIZES[qtype][0]


def _ks(qtype) -> tuple[int, ...]:
    """One block, several, and for the types of 32 an odd count of blocks."""
    return (32, 96, 544) if _block(qtype) == 32 else (256, 768)


@functools.cache
def _matrix(qtype, n, k, seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """(file bytes [n, row bytes] uint8, gguf-py's dequantized weights float64 [n, k]), kept
    for the next level's run."""
    raw = random_rows(qtype, n, k, seed)
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    return torch.from_numpy(raw), torch.from_numpy(w)


def _input(m, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * torch.linspace(0.1, 3.0, k)  # uneven channels


def _rounded(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] → the kernel's activations, float64: per block of 32 s = max|x| / 127 and
    round(x / s) * s, in float32 as tile_linear.cpp's tile_quantize_row."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    s = xb.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(xb / s).double() * s.double()).reshape(m, k)


def _rel_err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@needs_native
@every_level
@pytest.mark.parametrize("qtype", TILE_TYPES, ids=lambda t: t.name)
def test_tile_linear_is_the_product_of_its_rounded_activations(qtype):
    """Odd shapes (1 to 3 groups of 16, the last part-filled; K of one block and several):
    40 rows within float rounding of the float64 product of the rounded activations and
    gguf-py's weights, bias added, and close to the float product; their first 1, 3 and 16
    alone the same bits."""
    for k in _ks(qtype):
        x = _input(40, k, seed=k)
        xq = _rounded(x)
        for n in (1, 5, 17, 33):
            raw, w = _matrix(qtype, n, k, seed=n + k)
            bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
            layer = BlockLinear.from_stored([(qtype, raw)], k, bias)
            assert layer.packed0.numel() == packed_bytes(qtype, n, k) == \
                native.load().rs_block_packed_bytes(FORMATS[qtype], n, k)
            y = layer(x)
            for m in (1, 3, 16):
                assert torch.equal(layer(x[:m]), y[:m]), (k, n, m)
            y = y.double() - bias.double()
            err = (y - xq @ w.T).abs()
            assert (err <= EXACT_TOL * (xq.abs() @ w.abs().T)).all(), (k, n)
            assert _rel_err(y, x.double() @ w.T) < REL_TOL, (k, n)
    assert layer(x.bfloat16()).dtype == torch.bfloat16


@needs_native
@every_level
@pytest.mark.parametrize("qtype", TILE_TYPES, ids=lambda t: t.name)
def test_tile_rows_are_bit_identical_alone_or_in_any_batch(qtype):
    """n = 40: a group pair and a part-filled group; rows alone, in threes, in slices that
    cross register blocks, and shuffled: the bits each row has in the batch of 40."""
    n, k = 40, 2 * _ks(qtype)[-1]
    raw, _ = _matrix(qtype, n, k, seed=1)
    layer = BlockLinear.from_stored([(qtype, raw)], k, torch.randn(n))
    x = _input(40, k, seed=2)
    batched = layer(x)
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(40)]), batched)
    assert torch.equal(torch.cat([layer(x[i:i + 3]) for i in range(0, 40, 3)]), batched)
    for lo, hi in ((0, 2), (7, 23), (0, 31), (5, 37), (33, 40)):
        assert torch.equal(layer(x[lo:hi]), batched[lo:hi]), (lo, hi)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    assert torch.equal(layer(x[perm]), batched[perm])
    assert layer(x[:0]).shape == (0, n)


@needs_native
@every_level
def test_a_layer_mixing_tile_and_block_types_is_its_parts_side_by_side():
    """A fused layer of Q3_K rows (two shards: one part), Q6_K rows, IQ4_XS and MXFP4 rows:
    exactly each part's own layer output, side by side."""
    k = 512
    shards = [(T.Q3_K, 64), (T.Q3_K, 20), (T.Q6_K, 40), (T.IQ4_XS, 24), (T.MXFP4, 9)]
    mats = [(t, *_matrix(t, n, k, seed=i)) for i, (t, n) in enumerate(shards)]
    bias = torch.randn(sum(n for _, n in shards))
    layer = BlockLinear.from_stored([(t, raw) for t, raw, _ in mats], k, bias)
    assert layer.types == ("Q3_K", "Q6_K", "IQ4_XS", "MXFP4") and layer.out_features == 157
    x = _input(6, k)
    row, pieces = 0, []
    for t, raw, _ in mats:
        n = raw.shape[0]
        pieces.append(BlockLinear.from_stored([(t, raw)], k, bias[row:row + n])(x))
        row += n
    y = layer(x)
    assert torch.equal(y, torch.cat(pieces, dim=1))
    w = torch.cat([deq for _, _, deq in mats])
    assert _rel_err(y, x.double() @ w.T + bias.double()) < REL_TOL


@pytest.mark.parametrize("qtype", TILE_TYPES, ids=lambda t: t.name)
def test_tile_layers_refuse_what_does_not_fit(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw, _ = _matrix(qtype, 16, 2 * _ks(qtype)[-1])
    with pytest.raises(ValueError, match="multiple of its block"):
        BlockLinear.from_stored([(qtype, raw[:, :size])], block // 2)
    with pytest.raises(ValueError, match="do not hold"):
        BlockLinear.from_stored([(qtype, raw[:, :size + 1])], block)


@needs_native
@pytest.mark.parametrize("qtype", TILE_TYPES, ids=lambda t: t.name)
def test_packed_tiles_are_the_files_blocks_and_read_back_as_its_rows(qtype):
    """pack is the stated layout (tile_layout.py) byte for byte (any bytes: no field is read or
    changed) and unpacks to the file's rows; rows
    gathered from it (any lane, the part-filled last group, repeats) and a packed embedding on
    a head are gguf-py's dequantized rows bit for bit."""
    n, k = 37, _ks(qtype)[-1]
    raw, w = _matrix(qtype, n, k, seed=4)
    noise = torch.from_numpy(np.random.default_rng(5).integers(0, 256, tuple(raw.shape),
                                                                 dtype=np.uint8))
    assert torch.equal(pack(qtype, noise, k), pack_reference(qtype, noise))
    packed = pack(qtype, raw, k)
    assert torch.equal(packed, pack_reference(qtype, raw))
    assert torch.equal(unpack_rows(qtype, packed, k, torch.arange(n)), raw)
    ids = torch.tensor([0, 5, 5, 15, 16, 31, 32, 36, 17])
    rows = gather_rows(qtype, packed, k, ids)
    ref = w.float()[ids]
    assert torch.equal(rows.view(torch.int32), ref.view(torch.int32))
    assert torch.equal(rows, dequantize(raw[ids], qtype, (len(ids), k)))
    assert gather_rows(qtype, packed, k, ids[:0]).shape == (0, k)
    embedding = PackedEmbedding(BlockLinear.from_stored([(qtype, raw)], k))
    assert torch.equal(embedding(ids.reshape(3, 3)), ref)
    assert torch.equal(embedding.weight, w.float())


@pytest.mark.parametrize("qtype", TILE_TYPES, ids=lambda t: t.name)
def test_packed_size_is_the_file_size_within_the_last_group(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    k = 4096
    for n in (4096, 4097, 1):
        stored = n * k // block * size
        assert packed_bytes(qtype, n, k) == -(-n // 16) * 16 * k // block * size
        assert stored <= packed_bytes(qtype, n, k) < stored + 16 * k // block * size


# -- the dequantizer (no kernel needed) -----------------------------------------------------

@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_random_rows_are_finite_weights_of_a_sane_size(qtype):
    k = 2 * _ks(qtype)[-1]
    w = np.abs(gguf.quants.dequantize(random_rows(qtype, 32, k, seed=6), qtype))
    assert np.isfinite(w).all() and 0.5 < w.max() <= 1.0 and w.mean() > 0.05


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequantize_is_gguf_pys_reference(qtype):
    """The tile types through gguf-py itself: its bits, from numpy (a read-only map, as
    GGUFReader gives) or torch bytes, any shape; the block types by our torch code, within
    float rounding of it. A byte count that does not fit is refused."""
    n, k = 6, _ks(qtype)[-1]
    raw = random_rows(qtype, n, k, seed=7)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    raw.setflags(write=False)
    out = dequantize(raw, qtype, (n, k))
    assert out.dtype == torch.float32 and out.shape == (n, k)
    if qtype in REFERENCE_TYPES:
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32))
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    assert torch.equal(dequantize(torch.from_numpy(raw.copy()), qtype, (2, 3, k)),
                       out.reshape(2, 3, k))
    assert torch.equal(dequantize(raw[2:4], qtype, (2, k)), out[2:4])
    with pytest.raises(ValueError, match="bytes"):
        dequantize(raw[:, 1:], qtype, (n, k))
