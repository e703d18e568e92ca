"""The 4-bit layers (``--quantization q4``): GGUF's Q4_0 / Q4_1 blocks read as the file stores
them, the kernel's tolerance against the dequantized weights, rows bit-identical alone or in
any batch (VNNI and AMX paths), and a tiny model of each architecture against its float twin."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from test_numerics import PagedSeqs, make_runner

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.q4_linear import Q4Linear
from radixserve.models.gguf_quant import dequantize, q4_blocks
from radixserve.models.quantization import resolve_quantization

T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
pytestmark = pytest.mark.usefixtures("kernel_level")  # every CPU level built here
# per-block activations in two terms (~11 bits): measured ~3.5e-4 of the output's range
REL_TOL = 2e-3
Q4_ATOL = 1e-2  # tiny models' logits (|logit| ~ 3); measured max error ~4e-3


def _blocks(qtype, n, k, seed=0):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    return raw, dequantize(raw, qtype, (n, k))


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1])
def test_q4_blocks_hold_exactly_the_dequantized_weights(qtype):
    raw, w = _blocks(qtype, 48, 96)
    q, d, m = q4_blocks(raw, qtype, (48, 96))
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and d.dtype == m.dtype == torch.float16
    rebuilt = d.float().repeat_interleave(32, 1) * q.float() + m.float().repeat_interleave(32, 1)
    assert torch.equal(rebuilt, w)


def test_q4_blocks_refuse_other_types_and_shapes():
    raw, _ = _blocks(T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="Q4_0/Q4_1"):
        q4_blocks(raw, T.Q8_0, (4, 64))
    raw, _ = _blocks(T.Q4_1, 4, 64)
    with pytest.raises(ValueError, match="bytes"):
        q4_blocks(raw, T.Q4_1, (4, 96))


@needs_native
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (100, 64), (17, 32)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_q4_linear_close_to_the_dequantized_weights(qtype, shape, with_bias):
    n, k = shape
    raw, w = _blocks(qtype, n, k, seed=n + k)
    bias = torch.randn(n) if with_bias else None
    layer = Q4Linear.from_blocks(*q4_blocks(raw, qtype, shape), bias)
    x = torch.randn(5, k) * torch.linspace(0.1, 3.0, k)  # uneven channels, as in real models
    ref = x.double() @ w.double().T + (0 if bias is None else bias.double())
    err = (layer(x).double() - ref).abs().max() / ref.abs().max()
    assert err < REL_TOL
    assert layer(x.bfloat16()).dtype == torch.bfloat16


@needs_native
@pytest.mark.parametrize("shape", [(576, 576), (3072, 576), (40, 1536)])
def test_q4_linear_rows_are_bit_identical_alone_or_in_any_batch(shape):
    """Single rows and small groups take the VNNI path, 40 rows the AMX one (where the CPU has
    it): the same exact integer sums and the same float steps, so the same bits."""
    n, k = shape
    raw, _ = _blocks(T.Q4_1, n, k, seed=1)
    layer = Q4Linear.from_blocks(*q4_blocks(raw, T.Q4_1, shape), torch.randn(n))
    x = torch.randn(40, k)
    batched = layer(x)
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(40)]), batched)
    assert torch.equal(torch.cat([layer(x[i:i + 3]) for i in range(0, 40, 3)]), batched)
    assert torch.equal(layer(x[:33])[:5], batched[:5])
    assert layer(x[:0]).shape == (0, n)


@needs_native
def test_q4_linear_refuses_mismatched_blocks():
    q = torch.zeros(16, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="mismatched"):
        Q4Linear.from_blocks(q, torch.zeros(16, 3, dtype=torch.float16),
                             torch.zeros(16, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="mismatched"):
        Q4Linear.from_blocks(torch.zeros(16, 48, dtype=torch.uint8),
                             torch.zeros(16, 1, dtype=torch.float16),
                             torch.zeros(16, 1, dtype=torch.float16))


class _Reader:
    def __init__(self, qtype):
        t = type("Tensor", (), {"name": "blk.0.attn_q.weight", "tensor_type": qtype,
                                "shape": (64, 64)})
        self.tensors = [t]


@needs_native
def test_resolve_q4():
    assert resolve_quantization("q4", CPU, _Reader(T.Q4_1)) == "q4"
    assert resolve_quantization("q4", CPU, _Reader(T.Q4_0)) == "q4"
    assert resolve_quantization("auto", CPU, _Reader(T.Q4_1)) == "int8"  # throughput default
    with pytest.raises(ValueError, match="Q4_0 or Q4_1"):
        resolve_quantization("q4", CPU, _Reader(T.Q8_0))
    with pytest.raises(ValueError, match="Q4_0 or Q4_1"):
        resolve_quantization("q4", CPU, None)
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("q4", torch.device("cuda"), _Reader(T.Q4_1))


@needs_native
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_q4_model_matches_its_dequantized_weights(arch, tiny_gguf_files):
    """The 4-bit path's tolerance test: the float model on the same file holds exactly the
    weights the 4-bit layers read (Q4_0 dequantizes exactly), so only the activations' rounding
    differs; chunked prefill and decode steps, Q/K rows unpermuted (llama), q/k/v bias (qwen2)."""
    path = tiny_gguf_files(arch, "Q4_0")
    q4, ref = make_runner(path, quantization="q4"), make_runner(path)
    layer = q4.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Q4Linear)
    assert isinstance(layer.mlp.gate_up_proj, Q4Linear)
    assert isinstance(q4.model.lm_head, (Q4Linear, Int8Linear))
    tokens = [[(7 * i + 3) % q4.config.vocab_size for i in range(12)],
              [(5 * i + 1) % q4.config.vocab_size for i in range(7)]]
    paged = {"q4": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
        ours = q4.all_logits([paged["q4"].chunk(i, n) for i, n in step])
        theirs = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=Q4_ATOL, rtol=0)
