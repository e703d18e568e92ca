"""16-bit linear parts (F16 / BF16 kept as stored, float32 activations): the kernel at every
CPU level against the widened weights, rows bit-identical in any batch or chunking, exact
widening of every 16-bit value, parts beside block-quantized ones, and tiny F16 / BF16 GGUF
files and float16 / bfloat16 safetensors folders against transformers, loaded without a float32
copy of a matrix."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from kquants import quantize
from test_numerics import ATOL, PagedSeqs, hf_logits, make_runner, prompts
from tiny_models import load_gguf_model, make_hf_model
from transformers import AutoConfig, AutoModelForCausalLM

from radixserve.env_report import report
from radixserve.kernels import native
from radixserve.layers.block_linear import FORMATS, BlockLinear, packed_bytes
from radixserve.layers.block_rows import PackedEmbedding
from radixserve.layers.gguf_quant import dequantize
from radixserve.models.gguf_stored import memory_plan
from radixserve.models.half_stored import checkpoint_dtype
from radixserve.models.native_stack import NativeLayerStack
from radixserve.models.quantization import resolve_quantization
from radixserve.models.source import ModelSource

T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
DTYPES = {T.F16: torch.float16, T.BF16: torch.bfloat16}
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")


def _layer(qtype, n, k, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(DTYPES[qtype])
    b = torch.randn(n, generator=gen) if bias else None
    return BlockLinear.from_stored([(qtype, w.view(torch.uint8))], k, b), w, b


def _input(m, k, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * torch.linspace(0.1, 3.0, k)


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("qtype", list(DTYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(100, 77), (17, 768), (33, 1000), (1, 5), (70, 576)])
def test_half_linear_is_the_float_product_of_the_stored_weights(qtype, shape):
    """Any K (no blocks); only float32 rounding of the sums differs from x @ W.float().T."""
    n, k = shape
    layer, w, b = _layer(qtype, n, k, seed=n + k)
    x = _input(9, k)
    ref = x.double() @ w.double().T + b.double()
    scale = (x.double().abs() @ w.double().abs().T).max()  # the sums' magnitude
    assert (layer(x).double() - ref).abs().max() <= 1e-6 * scale
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    assert layer.packed0.numel() == packed_bytes(qtype, n, k) == -(-n // 16) * 16 * k * 2 == \
        native.load().rs_block_packed_bytes(FORMATS[qtype], n, k)


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("qtype", list(DTYPES), ids=lambda t: t.name)
def test_half_linear_rows_are_bit_identical_alone_or_in_any_batch(qtype):
    """One row (decode tiles), a few (register tiles widening in registers), 8+ (the item's
    strip widened once), more than one 64-row chunk: the same in-order sums."""
    n, k = 150, 333
    layer, _, _ = _layer(qtype, n, k, seed=3)
    x = _input(140, k, seed=4)
    batched = layer(x)
    for size in (1, 3, 7, 16, 64):
        assert torch.equal(torch.cat([layer(x[i:i + size]) for i in range(0, 140, size)]),
                           batched), size
    assert torch.equal(layer(x[70:71]), batched[70:71])
    assert layer(x[:0]).shape == (0, n)


@needs_native
@pytest.mark.parametrize("qtype", list(DTYPES), ids=lambda t: t.name)
def test_the_fma_levels_agree_bit_for_bit(qtype):
    """avx2, avx512 and amx run the same fused multiply-adds in the same order."""
    info = native.describe()
    levels = [lv for lv in ("amx", "avx512", "avx2") if lv in info.runnable and lv in info.built]
    if len(levels) < 2:
        pytest.skip("fewer than two FMA levels run here")
    x, outs = _input(20, 200, seed=5), []
    saved = os.environ.get(native.ISA_ENV)
    try:
        for level in levels:
            os.environ[native.ISA_ENV] = level
            native.reset()
            outs.append(_layer(qtype, 40, 200, seed=6)[0](x))
    finally:
        if saved is None:
            os.environ.pop(native.ISA_ENV, None)
        else:
            os.environ[native.ISA_ENV] = saved
        native.reset()
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


def _every_value(qtype) -> torch.Tensor:
    """Every finite value of the 16-bit type (subnormals, both zeros, the largest), 1-D."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    values = bits.view(DTYPES[qtype])
    return values[torch.isfinite(values)]


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("qtype", list(DTYPES), ids=lambda t: t.name)
def test_every_stored_value_widens_exactly(qtype):
    """Weights [N, 2] of every finite value (column 1 in reverse) against one-hot rows: each
    output must be the weight itself, exactly (a product by 1, a sum with 0 x a weight)."""
    v = _every_value(qtype)
    w = torch.stack((v, v.flip(0)), dim=1)
    layer = BlockLinear.from_stored([(qtype, w.view(torch.uint8))], 2)
    assert torch.equal(layer(torch.eye(2)), w.float().T)


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_half_parts_run_beside_block_parts():
    """A fused layer of F16, Q4_K and BF16 matrices: each part's columns are its own layer's."""
    k, gen = 512, np.random.default_rng(7)
    f16 = torch.from_numpy(gen.standard_normal((40, k)).astype(np.float16))
    q4 = gen.standard_normal((32, k)).astype(np.float32)
    q4_raw = torch.from_numpy(quantize(q4, T.Q4_K)).reshape(32, -1)
    bf16 = torch.from_numpy(gen.standard_normal((24, k)).astype(np.float32)).bfloat16()
    parts = [(T.F16, f16.view(torch.uint8)), (T.Q4_K, q4_raw), (T.BF16, bf16.view(torch.uint8))]
    bias = torch.randn(96)
    layer = BlockLinear.from_stored(parts, k, bias)
    assert layer.types == ("F16", "Q4_K", "BF16")
    x = _input(5, k)
    y, row = layer(x), 0
    for part in parts:
        n = part[1].shape[0]
        assert torch.equal(y[:, row:row + n], BlockLinear.from_stored([part], k,
                                                                       bias[row:row + n])(x))
        row += n
    w = torch.cat([f16.float(), dequantize(q4_raw, T.Q4_K, (32, k)), bf16.float()])
    ref = x.double() @ w.double().T + bias.double()
    assert (y.double() - ref).abs().max() < 2e-2 * ref.abs().max()  # Q4_K's 8-bit activations


class _Reader:
    def __init__(self, *qtypes):
        self.tensors = [type("Tensor", (), {"name": f"blk.{i}.attn_q.weight", "tensor_type": q,
                                            "shape": (64, 64)}) for i, q in enumerate(qtypes)]


@needs_native
def test_resolve_16_bit_checkpoints():
    for qtype in (T.F16, T.BF16):
        assert resolve_quantization("auto", CPU, _Reader(qtype)) == "gguf"
        assert resolve_quantization("gguf", CPU, _Reader(qtype, T.F32)) == "gguf"
    assert resolve_quantization("auto", CPU, _Reader(T.F32)) == "none"
    with pytest.raises(ValueError, match="block-quantized, F16 or BF16"):
        resolve_quantization("gguf", CPU, _Reader(T.F32))
    for dtype in (torch.float16, torch.bfloat16):
        assert resolve_quantization("auto", CPU, None, dtype) == "16bit-stored"
        assert resolve_quantization("16bit-stored", CPU, None, dtype) == "16bit-stored"
        assert resolve_quantization("none", CPU, None, dtype) == "none"
        assert resolve_quantization("auto", torch.device("cuda"), None, dtype) == "none"
    assert resolve_quantization("auto", CPU, None, torch.float32) == "none"
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        resolve_quantization("16bit-stored", CPU, None, torch.float32)
    with pytest.raises(ValueError, match="GGUF files: gguf"):
        resolve_quantization("16bit-stored", CPU, _Reader(T.F16))
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("16bit-stored", torch.device("cuda"), None, torch.bfloat16)


def _assert_no_float_matrix(model, embedding_ok: bool):
    """Every linear is 16-bit parts and no float32 matrix is held but the rotary tables (and
    the float32 embedding table of a safetensors load, as the float model has)."""
    layer = model.layers[0]
    for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
              layer.mlp.down_proj, model.lm_head):
        assert isinstance(m, BlockLinear) and set(m.types) <= {"F16", "BF16"}, m
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.dtype == torch.float32 and t.dim() >= 2:
            assert "rotary" in name or (embedding_ok and name == "embed_tokens.weight"), name


def _compare(runner, reference):
    tokens = prompts(runner.config.vocab_size, seed=4)
    paged = PagedSeqs(tokens)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)
    # decode steps, through the native layer stack (one call per layer, q/k norms included)
    steps = PagedSeqs(tokens)
    runner.all_logits([steps.chunk(i, len(t) - 1) for i, t in enumerate(tokens) if len(t) > 1])
    last = runner.all_logits([steps.chunk(i, 1) for i, t in enumerate(tokens) if len(t) > 1])
    assert isinstance(runner.model._stack, NativeLayerStack)
    for t, logits in zip([t for t in tokens if len(t) > 1], last):
        torch.testing.assert_close(logits, hf_logits(reference, t)[-1:], atol=ATOL, rtol=0)


@needs_native
@pytest.mark.parametrize("ftype", ["F16", "BF16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_16_bit_gguf_model_matches_transformers(arch, ftype, tiny_hf_dirs, tiny_gguf_files):
    """Llama's Q/K rows unpermuted, Qwen2's biases, Qwen3's q/k norms: the file's 16-bit
    weights run as stored (auto resolves to gguf) against transformers on the same weights."""
    path = tiny_gguf_files(arch, ftype)
    reader = gguf.GGUFReader(str(path))
    assert resolve_quantization("auto", CPU, reader) == "gguf"
    runner = make_runner(path, quantization="gguf")
    _assert_no_float_matrix(runner.model, embedding_ok=False)
    plan = memory_plan((t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
                       for t in reader.tensors)
    assert set(plan.by_type) == {ftype}
    held = sum(b.numel() for m in runner.model.modules() if isinstance(m, BlockLinear)
               for name, b in m.named_buffers() if name.startswith("packed"))
    assert held == plan.weights
    config = AutoConfig.from_pretrained(tiny_hf_dirs[arch]) if arch == "qwen3" else None
    _compare(runner, load_gguf_model(path, config))


@pytest.fixture(scope="module")
def half_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("half_hf")
    return {(arch, dtype): make_hf_model(arch, root / f"{arch}-{dtype}", save_dtype=dtype,
                                         tie_word_embeddings=arch == "qwen2")
            for arch, dtype in (("llama", torch.bfloat16), ("qwen2", torch.float16),
                                ("qwen3", torch.bfloat16))}


@needs_native
@pytest.mark.parametrize("key", [("llama", torch.bfloat16), ("qwen2", torch.float16),
                                 ("qwen3", torch.bfloat16)], ids=lambda k: f"{k[0]}-{k[1]}")
def test_16_bit_safetensors_folder_matches_transformers(key, half_folders):
    """auto keeps a float16 / bfloat16 folder's linear weights in 16 bits (a tied head too:
    qwen2 here), against transformers' float32 model of the same folder."""
    folder = half_folders[key]
    dtype = checkpoint_dtype(ModelSource.resolve(str(folder)))
    assert dtype == key[1]
    assert resolve_quantization("auto", CPU, None, dtype) == "16bit-stored"
    runner = make_runner(folder, quantization="16bit-stored")
    _assert_no_float_matrix(runner.model, embedding_ok=True)
    text = report(str(folder))
    assert "quantization auto -> 16bit-stored" in text and "16 bits as stored" in text
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if key[0] == "qwen2":  # tied: the table once, the looked-up rows the head's 16 bits
        assert isinstance(runner.model.embed_tokens, PackedEmbedding)
        assert torch.equal(runner.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    _compare(runner, reference)
