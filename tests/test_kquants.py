"""Tests for tests/kquants.py: its K-quant bytes decode with gguf's reference dequantizer.

Error bounds are relative RMS errors, measured on 64 x 512 standard-normal matrices (seeds
0-19: Q4_K 0.0782-0.0787, Q5_K 0.0384-0.0385, Q6_K 0.0189; worst single row 0.084, 0.042,
0.020) and set with a ~15% margin.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq
from kquants import K_TYPES, quantize, quantize_k

T = GGMLQuantizationType
REL_RMS_BOUND = {T.Q4_K: 0.09, T.Q5_K: 0.045, T.Q6_K: 0.022}
OUTLIER_AT, OUTLIER = 37, 1000.0


def _rel_rms(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact**2)))


def _roundtrip(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    return gq.dequantize(quantize_k(w, qtype), qtype)


def _gaussian(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((64, 512)).astype(np.float32)


def _edge_rows() -> np.ndarray:
    """All zeros; constant 0.7; constant -0.7; standard normal with one huge outlier."""
    rows = np.zeros((4, 512), np.float32)
    rows[1], rows[2] = 0.7, -0.7
    rows[3] = np.random.default_rng(1).standard_normal(512)
    rows[3, OUTLIER_AT] = OUTLIER
    return rows


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(64, 512), (2, 3, 256), (256,)])
def test_dtype_and_shape(qtype, shape):
    _, type_size = GGML_QUANT_SIZES[qtype]
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = quantize_k(w, qtype)
    assert q.dtype == np.uint8
    assert q.shape == (*shape[:-1], shape[-1] // 256 * type_size)
    assert gq.dequantize(q, qtype).shape == shape


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_gaussian_error(qtype):
    w = np.concatenate([_gaussian(), _edge_rows()])  # edge rows must not disturb the others
    r = _roundtrip(w, qtype)[:64]
    assert np.isfinite(r).all()
    assert _rel_rms(r, w[:64]) < REL_RMS_BOUND[qtype]


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_edge_rows(qtype):
    w = _edge_rows()
    r = _roundtrip(w, qtype)
    assert np.isfinite(r).all()
    assert not r[0].any()
    for row in (1, 2):  # f16 d and 6/8-bit scales: measured <= 3e-4
        assert _rel_rms(r[row], w[row]) < 1e-3
    # the outlier itself is kept (measured error <= 0.13) ...
    assert abs(r[3, OUTLIER_AT] - OUTLIER) < 1e-3 * OUTLIER
    # ... its super-block's other sub-blocks are coded coarsely, not lost (measured rel RMS
    # 0.33 Q4_K, 0.15 Q5_K, 0.08 Q6_K) ...
    rest = np.r_[0:32, 64:256]
    assert _rel_rms(r[3, rest], w[3, rest]) < 0.5
    # ... and the next super-block is unaffected
    assert _rel_rms(r[3, 256:], w[3, 256:]) < REL_RMS_BOUND[qtype]


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_requantize_is_stable(qtype):
    """Quantizing the dequantized weights again moves them little (measured: Q4_K and Q6_K
    reproduce them exactly, Q5_K within 0.2% relative RMS; the edge rows all exactly)."""
    r = _roundtrip(np.concatenate([_gaussian(), _edge_rows()]), qtype)
    rr = _roundtrip(r, qtype)
    assert _rel_rms(rr[:64], r[:64]) < 0.005
    np.testing.assert_allclose(rr[64:], r[64:], rtol=1e-3, atol=1e-3)


def test_quantize_dispatches():
    w = _gaussian()
    assert np.array_equal(quantize(w, T.Q4_K), quantize_k(w, T.Q4_K))
    assert np.array_equal(quantize(w, T.Q8_0), gq.quantize(w, T.Q8_0))


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        quantize_k(np.zeros((2, 128), np.float32), T.Q4_K)
    with pytest.raises(ValueError):
        quantize_k(np.zeros((2, 256), np.float32), T.Q8_0)
