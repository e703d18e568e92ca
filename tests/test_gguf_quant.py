"""Tests for radixserve.layers.gguf_quant against the gguf package's numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf import quants as gq

from radixserve.layers.gguf_quant import SUPPORTED_TYPES, dequantize

T = GGMLQuantizationType
SIMPLE_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]  # gguf can quantize these
K_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]  # gguf can only dequantize these
# byte offsets of the f16 super-block scales (d, dmin) in each K-quant block
K_F16_OFFSETS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _random_k_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random K-quant bytes with finite, sane f16 scales (so no NaN/inf appear)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = _rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block_size * type_size), dtype=np.uint8)
    blocks = data.reshape(-1, type_size)
    for off in K_F16_OFFSETS[qtype]:
        scale = rng.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return data


def _check_matches_reference(data: np.ndarray, qtype: GGMLQuantizationType, shape) -> None:
    ref = gq.dequantize(data, qtype).astype(np.float32)
    assert ref.shape == tuple(shape)
    out = dequantize(data, qtype, tuple(shape))
    assert out.dtype == torch.float32 and tuple(out.shape) == tuple(shape)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.from_numpy(ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("qtype", SIMPLE_TYPES, ids=lambda t: t.name)
def test_simple_quants_match_reference(qtype):
    x = _rng(1).standard_normal((48, 256)).astype(np.float32)
    x[0] = 0.0  # all-zero blocks (d == 0)
    x[1, :32] = np.linspace(-3, 5, 32)  # exercise min/max extremes
    data = gq.quantize(x, qtype)
    assert data.dtype == np.uint8
    _check_matches_reference(data, qtype, x.shape)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quants_match_reference(qtype):
    data = _random_k_blocks(qtype, rows=24, cols=512, seed=int(qtype))
    _check_matches_reference(data, qtype, (24, 512))


@pytest.mark.parametrize("qtype", SIMPLE_TYPES + K_TYPES, ids=lambda t: t.name)
def test_3d_shape_and_torch_input(qtype):
    # a 3-D logical shape and a torch uint8 tensor input give the same values
    shape = (2, 3, 256)
    if qtype in K_TYPES:
        data = _random_k_blocks(qtype, rows=6, cols=256, seed=7)
    else:
        data = gq.quantize(_rng(2).standard_normal((6, 256)).astype(np.float32), qtype)
    ref = dequantize(data, qtype, shape)
    assert tuple(ref.shape) == shape
    out = dequantize(torch.from_numpy(data.copy()), qtype, shape)
    assert torch.equal(out, ref)


def test_float_types():
    x = _rng(3).standard_normal((8, 40)).astype(np.float32)
    out = dequantize(x, T.F32, (8, 40))
    assert torch.equal(out, torch.from_numpy(x))
    out[0, 0] = 123.0  # result must not alias the input buffer
    assert x[0, 0] != 123.0

    h = x.astype(np.float16)
    torch.testing.assert_close(
        dequantize(h, T.F16, (8, 40)), torch.from_numpy(h.astype(np.float32)), rtol=0, atol=0
    )

    # BF16 arrives from GGUFReader as raw uint8 bytes (rows, 2 * cols)
    bf = gq.quantize(x, T.BF16)
    assert bf.dtype == np.uint8 and bf.shape == (8, 80)
    ref = gq.dequantize(bf, T.BF16)
    out = dequantize(bf, T.BF16, (8, 40))
    torch.testing.assert_close(out, torch.from_numpy(ref), rtol=0, atol=0)
    # ... and a uint16 / bfloat16 view of the same bytes works too
    assert torch.equal(dequantize(bf.view(np.uint16), T.BF16, (8, 40)), out)
    assert torch.equal(dequantize(torch.from_numpy(x).bfloat16(), T.BF16, (8, 40)), out)


@pytest.mark.parametrize("qtype", [T.Q8_1, T.Q8_K, T.NVFP4], ids=lambda t: t.name)
def test_unsupported_type_raises(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    with pytest.raises(ValueError, match=f"unsupported GGUF tensor type {qtype.name}") as exc:
        dequantize(np.zeros((1, 256 // block * size), dtype=np.uint8), qtype, (1, 256))
    for name in SUPPORTED_TYPES:
        assert name in str(exc.value)


def test_supported_types_listed():
    assert set(SUPPORTED_TYPES) == {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
        "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS",
        "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
    }


def test_size_mismatch_raises():
    data = gq.quantize(np.ones((4, 64), dtype=np.float32), T.Q8_0)
    with pytest.raises(ValueError, match="bytes"):
        dequantize(data, T.Q8_0, (4, 96))
    with pytest.raises(ValueError, match="multiple"):
        dequantize(data, T.Q8_0, (8, 40))


def test_gguf_file_round_trip(tmp_path):
    rng = _rng(4)
    originals = {
        "w_q8": (rng.standard_normal((64, 96)).astype(np.float32), T.Q8_0),
        "w_q4": (rng.standard_normal((32, 128)).astype(np.float32), T.Q4_0),
        "w_bf16": (rng.standard_normal((16, 48)).astype(np.float32), T.BF16),
        "w_f16": (rng.standard_normal((16, 48)).astype(np.float32), T.F16),
    }
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    for name, (x, qtype) in originals.items():
        writer.add_tensor(name, gq.quantize(x, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(originals)
    # max abs error bounds relative to the per-row absolute maximum
    tolerance = {T.Q8_0: 1 / 127, T.Q4_0: 1 / 8, T.BF16: 2**-8, T.F16: 2**-11}
    for name, (x, qtype) in originals.items():
        t = tensors[name]
        assert t.tensor_type == qtype
        shape = tuple(reversed([int(d) for d in t.shape]))
        assert shape == x.shape
        out = dequantize(t.data, t.tensor_type, shape)
        assert out.dtype == torch.float32 and tuple(out.shape) == x.shape
        err = (out - torch.from_numpy(x)).abs().max().item()
        assert err <= tolerance[qtype] * np.abs(x).max() + 1e-6, (name, err)
        ref = gq.dequantize(np.asarray(t.data), qtype)
        torch.testing.assert_close(out, torch.from_numpy(ref), rtol=0, atol=1e-6)
    assert tensors["w_bf16"].data.dtype == np.uint8  # how GGUFReader delivers BF16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", SIMPLE_TYPES + K_TYPES, ids=lambda t: t.name)
def test_cuda_matches_cpu(qtype):
    if qtype in K_TYPES:
        data = _random_k_blocks(qtype, rows=16, cols=512, seed=11)
    else:
        data = gq.quantize(_rng(5).standard_normal((16, 512)).astype(np.float32), qtype)
    cpu = dequantize(data, qtype, (16, 512))
    gpu = dequantize(torch.from_numpy(data).cuda(), qtype, (16, 512))
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-6)
