"""Int8 linear layers: the two-term activation quantizer, tolerance against the float layer
and the dequantized weights, batch invariance (bit-exact), and how `auto` resolves."""

from __future__ import annotations

import gguf
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.kernels import native
from radixserve.layers import int8_linear
from radixserve.layers.int8_linear import Int8Linear, quantize_rows, quantize_weight
from radixserve.models import quantization
from radixserve.models.quantization import quantize_linears_, resolve_quantization

CPU = torch.device("cpu")


@pytest.fixture(params=["native", "int_mm"])
def gemm(request, monkeypatch):
    """Run the test with each GEMM: the native kernel and the torch reference (torch._int_mm)."""
    if request.param == "native":
        if native.load() is None:
            pytest.skip("native kernels unavailable here")
        return request.param
    monkeypatch.setattr(int8_linear, "_native_weight", lambda *args: None)
    return request.param


def test_quantize_rows_keeps_about_15_bits_per_row():
    x = torch.randn(7, 96) * torch.logspace(-3, 3, 7)[:, None]
    x[3] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and q.shape == (14, 96) and scale.shape == (7, 1)
    hi, lo = q[:7].float(), q[7:].float()
    assert hi.abs().max() <= 127 and lo.abs().max() <= 127
    assert torch.equal(hi.abs().amax(dim=1)[[0, 1, 2, 4, 5, 6]], torch.full((6,), 127.0))
    back = scale * (hi + lo / 254)
    # each element within half a low step (s / 508) plus float rounding
    assert ((back - x).abs() <= scale / 500 + 1e-6 * x.abs()).all()
    assert torch.equal(back[3], torch.zeros(96))


def test_quantize_weight_per_channel():
    w = torch.randn(5, 32) * torch.tensor([1e-3, 1.0, 10.0, 0.0, 3.0])[:, None]
    q, scale = quantize_weight(w)
    assert q.dtype == torch.int8 and scale.shape == (5,)
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    assert torch.equal(q[3], torch.zeros(32, dtype=torch.int8))


def test_close_to_the_dequantized_and_the_float_layer(gemm):
    torch.manual_seed(0)
    w, b = torch.randn(48, 80) * 0.1, torch.randn(48)
    lin = Int8Linear.from_float(w, b)
    x = torch.randn(9, 80)
    y = lin(x)
    qw, scale = quantize_weight(w)
    dequantized = x @ (qw.float() * scale[:, None]).t() + b
    float_out = x @ w.t() + b
    # against its own (dequantized) weights only the ~15-bit activation rounding remains
    assert torch.allclose(y, dequantized, rtol=1e-3, atol=1e-3)
    rel = (y - float_out).norm() / float_out.norm()
    assert rel < 0.02


def test_other_float_dtypes_come_back_in_their_dtype(gemm):
    lin = Int8Linear.from_float(torch.randn(16, 32))
    x = torch.randn(3, 32)
    y = lin(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), lin(x), rtol=2e-2, atol=2e-2)


def _with_int_mm(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(int8_linear, "_native_weight", lambda *args: None)
        mp.setattr(int8_linear, "_native_weight", lambda *args: None)
        return Int8Linear.from_float(weight, bias)


@settings(max_examples=25, deadline=None)
@given(num_rows=st.integers(1, 70), lo=st.integers(0, 69), seed=st.integers(0, 2**16))
def test_rows_are_bit_identical_alone_or_in_any_batch(num_rows, lo, seed):
    gen = torch.Generator().manual_seed(seed)
    w, b = torch.randn(200, 64, generator=gen), torch.randn(200, generator=gen)
    x = torch.randn(num_rows, 64, generator=gen) * 3
    lo = min(lo, num_rows - 1)
    for lin in (Int8Linear.from_float(w, b), _with_int_mm(w, b)):
        full = lin(x)
        assert torch.equal(lin(x[lo:lo + 1]), full[lo:lo + 1])
        assert torch.equal(lin(x[lo:]), full[lo:])


@pytest.mark.usefixtures("kernel_level")
def test_both_gemms_agree_bit_for_bit():
    if not quantization.int8_kernels_available():
        pytest.skip("no native kernels here")
    w, x = torch.randn(96, 128), torch.randn(33, 128)
    assert torch.equal(_with_int_mm(w)(x), Int8Linear.from_float(w)(x))


def test_quantize_linears_swaps_layers_and_unties_the_head():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(10, 8)
            self.proj = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
            self.lm_head = None

    model = quantize_linears_(Tiny())
    assert isinstance(model.proj[0], Int8Linear) and model.proj[0].bias is not None
    assert isinstance(model.lm_head, Int8Linear)
    assert (model.lm_head.out_features, model.lm_head.in_features) == (10, 8)
    assert isinstance(model.embed_tokens, torch.nn.Embedding)


class _Tensor:
    def __init__(self, name, qtype):
        self.name, self.tensor_type, self.shape = name, qtype, (8, 8)


class _Reader:
    def __init__(self, qtype):
        q = gguf.GGMLQuantizationType
        self.tensors = [_Tensor("token_embd.weight", q.Q8_0), _Tensor("blk.0.attn_norm.weight",
                                                                     q.F32)]
        self.tensors[1].shape = (8,)
        self.tensors.append(_Tensor("blk.0.ffn_down.weight", qtype))


def test_auto_keeps_quantized_gguf_files_as_stored_on_cpu_only(monkeypatch):
    monkeypatch.setattr(quantization, "int8_kernels_available", lambda: True)
    q = gguf.GGMLQuantizationType
    assert resolve_quantization("auto", CPU, _Reader(q.Q4_1)) == "gguf"  # as stored
    assert resolve_quantization("auto", CPU, _Reader(q.Q4_K)) == "gguf"
    assert resolve_quantization("auto", CPU, _Reader(q.F16)) == "gguf"  # 16-bit parts
    assert resolve_quantization("auto", CPU, _Reader(q.F32)) == "none"
    assert resolve_quantization("auto", CPU, None) == "none"  # a Hugging Face folder
    assert resolve_quantization("auto", torch.device("cuda"), _Reader(q.Q4_1)) == "none"
    assert resolve_quantization("int8", CPU, None) == "int8"
    assert resolve_quantization("none", CPU, _Reader(q.Q4_1)) == "none"
    monkeypatch.setattr(quantization, "int8_kernels_available", lambda: False)  # no kernels
    assert resolve_quantization("auto", CPU, _Reader(q.Q4_1)) == "none"
    with pytest.raises(ValueError, match="needs the native CPU kernels"):
        resolve_quantization("int8", CPU, _Reader(q.Q4_1))


def test_bad_quantization_names_and_devices_are_refused(monkeypatch):
    monkeypatch.setattr(quantization, "int8_kernels_available", lambda: True)
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        resolve_quantization("int4", CPU, None)
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("int8", torch.device("cuda"), None)
