"""GGUF blocks as stored (``--quantization gguf``, the default for quantized GGUF files): every
block type's kernel against the dequantized weights, rows bit-identical alone or in any batch,
layers that mix types, the load without a float copy, and tiny models of each architecture
(legacy and K-quant mixes) against their float twins."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from block_pack_reference import reference_pack
from kquants import quantize
from mapped_files import mapped_file
from test_numerics import PagedSeqs, make_runner
from tiny_models import hf_to_gguf, make_hf_model

from radixserve.kernels import native
from radixserve.layers.block_linear import (FORMATS, HALF_TYPES, TILE_TYPES, BlockLinear, pack,
                                            packed_bytes)
from radixserve.layers.block_rows import PackedEmbedding, gather_rows
from radixserve.layers.gguf_quant import dequantize
from radixserve.models.gguf_stored import StoredEmbedding, memory_plan
from radixserve.models.quantization import resolve_quantization

T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
# 16-bit parts: test_half_linear.py; tile types: test_tile_types.py
TYPES = [t for t in FORMATS if t not in HALF_TYPES and t not in TILE_TYPES]
K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
pytestmark = pytest.mark.usefixtures("kernel_level")  # every CPU level built here
# activations in 8 bits per block of 32 (llama.cpp's Q8_1): measured 3e-3 .. 9e-3 of the
# output's range on these random matrices
REL_TOL = 1.5e-2
# of the logits' range: measured up to 0.028 (8-bit activations through random 2-layer models);
# a wiring fault (rows, parts, scales) is off by the logits' whole range
MODEL_REL = 0.05
# the same with K-quants' activation steps (block_linear.cpp: per 256, powers of two per 32):
# measured 0.035 .. 0.062 on the llama, qwen2 and qwen3 models below
MODEL_REL_K = 0.08


def _matrix(qtype, n, k, seed=0):
    """(file bytes [n, row bytes] uint8, their dequantized float32 weights)."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    raw = quantize(w, qtype)
    return torch.from_numpy(raw).reshape(n, -1), dequantize(raw, qtype, (n, k))


def _input(m, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * torch.linspace(0.1, 3.0, k)  # uneven channels


def _rel_err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


@needs_native
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(100, 512), (17, 768), (48, 256)])
def test_block_linear_close_to_the_dequantized_weights(qtype, shape):
    n, k = shape
    raw, w = _matrix(qtype, n, k, seed=n + k)
    bias = torch.randn(n)
    layer = BlockLinear.from_stored([(qtype, raw)], k, bias)
    x = _input(5, k)
    ref = x.double() @ w.double().T + bias.double()
    assert _rel_err(layer(x), ref) < REL_TOL
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    assert layer.packed0.numel() == packed_bytes(qtype, n, k) == \
        native.load().rs_block_packed_bytes(FORMATS[qtype], n, k)


def _k_quant_activations(x):
    """x [M, K] float32 -> the K-quant kernels' rounded activations, float64
    (block_linear.cpp: a step per super-block of 256, each block's a power-of-two fraction)."""
    m, k = x.shape
    xb = x.reshape(m, k // 256, 8, 32)
    bmax = xb.abs().amax(-1)
    amax = bmax.amax(-1, keepdim=True)
    s = amax.clamp_min(1e-30) / 127
    e = torch.zeros_like(bmax)
    for _ in range(3):
        e += ((e < 3) & (bmax * 2 ** (e + 1) <= amax)).float()
    step = (s * (1 / 2 ** e)).unsqueeze(-1)
    return (torch.round(xb / step).double() * step.double()).reshape(m, k)


@needs_native
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 5, 16, 40, 100])
def test_k_quants_are_exact_integer_sums_of_their_rounded_activations(qtype, m):
    """K-quants' numerics (block_linear.cpp's header): only the float steps' rounding after
    the activations' own: within 2e-5 of the float64 product of those activations and the
    dequantized weights, on the packed, held (16 rows) and decoded paths alike (a scale, min,
    shift or row
    wired wrong is off by far more). The input's blocks differ in size, so they take every
    shift."""
    n, k = 100, 768
    raw, w = _matrix(qtype, n, k, seed=7)
    layer = BlockLinear.from_stored([(qtype, raw)], k)
    scale = torch.tensor([1.0, 0.45, 0.2, 0.09, 0.04, 0.6, 0.3, 0.12])
    x = _input(m, k, seed=m) * scale.repeat_interleave(32).repeat(k // 256)
    assert _rel_err(layer(x), _k_quant_activations(x) @ w.double().T) < 2e-5


def _extreme_blocks(qtype, n, k, q6_scale):
    """[n, row bytes] uint8: every code at its largest (all code bits set; Q8_0 -128), every
    scale at its largest magnitude (K-quants' 6-bit 63, Q6_K's int8 q6_scale), mins 0, d 2^-8:
    the integer sums' bounds in block_linear.cpp's int16 pair sums and madds."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = np.full((n, k // block, size), 0xFF, np.uint8)
    d = np.frombuffer(np.float16(2.0 ** -8).tobytes(), np.uint8)
    if qtype == T.Q6_K:
        b[..., 192:208] = np.uint8(q6_scale & 0xFF)
        b[..., 208:210] = d
        return torch.from_numpy(b.reshape(n, -1))
    b[..., 0:2] = d
    if qtype in (T.Q4_K, T.Q5_K):  # dmin 0; scales 63 and mins 0 in their 12-byte packing
        b[..., 2:4] = 0
        b[..., 4:8], b[..., 8:12], b[..., 12:16] = 0xFF, 0x00, 0x0F
    elif qtype in (T.Q4_1, T.Q5_1):
        b[..., 2:4] = 0  # m
    elif qtype == T.Q8_0:
        b[..., 2:] = 0x80
    return torch.from_numpy(b.reshape(n, -1))


@needs_native
@pytest.mark.parametrize("qtype, q6_scale", [(t, -128) for t in TYPES] + [(T.Q6_K, 127)],
                         ids=lambda v: v.name if isinstance(v, T) else str(v))
def test_largest_codes_and_scales_against_the_largest_activations(qtype, q6_scale):
    """Codes, scales and activations all at their extremes, of one sign (the integer sums at
    their bounds: a block's int16 pair sums below VNNI, the scale madds): every path (1, 4,
    16 and 100 rows) gives the float64 product (the activations round exactly)."""
    n, k = 40, 512
    raw = _extreme_blocks(qtype, n, k, q6_scale)
    w = dequantize(raw.numpy(), qtype, (n, k))
    layer = BlockLinear.from_stored([(qtype, raw)], k)
    for sign in (1.0, -1.0):
        for m in (1, 4, 16, 100):
            x = torch.full((m, k), sign)
            assert _rel_err(layer(x), x.double() @ w.double().T) < 1e-5, (sign, m)


@needs_native
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_block_linear_rows_are_bit_identical_alone_or_in_any_batch(qtype):
    """Single rows and small groups take the dot-product path; 40 and 100 rows the AMX one
    for the 4-bit legacy types (where the CPU has it), the others the weights decoded once per
    work item (block_linear.cpp: legacy from 12-96 rows by level and width; Q5_K / Q6_K
    from 4-12 by level / 32, Q4_K from 64 / 96); at AVX-512 the K-quants from 5 rows until
    they decode hold each block's codes in registers for up to 32 rows at a time: the same
    exact integer sums and float steps.
    n = 72: a group pair and a lone, part-filled group."""
    n, k = 72, 512
    raw, _ = _matrix(qtype, n, k, seed=1)
    layer = BlockLinear.from_stored([(qtype, raw)], k, torch.randn(n))
    x = _input(100, k, seed=2)
    batched = layer(x)
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(100)]), batched)
    assert torch.equal(torch.cat([layer(x[i:i + 3]) for i in range(0, 100, 3)]), batched)
    assert torch.equal(layer(x[:33])[:5], batched[:5])
    assert torch.equal(layer(x[7:23]), batched[7:23])
    assert torch.equal(layer(x[:31]), batched[:31])
    assert torch.equal(layer(x[50:56]), batched[50:56])
    assert torch.equal(layer(x[60:64]), batched[60:64])
    assert torch.equal(layer(x[60:65]), batched[60:65])
    assert torch.equal(layer(x[:40]), batched[:40])
    assert layer(x[:0]).shape == (0, n)


@needs_native
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K], ids=lambda t: t.name)
def test_k_quants_held_or_decoded_give_the_same_bits(qtype):
    """AMD Zen 4 keeps Q4_K / Q5_K codes in registers at every row count, other cores decode
    them from 32-96 rows (block_linear.cpp: zen4()): both ways, forced on any machine, give each
    row the bits it has alone, and the same bits as each other."""
    lib = native.load()
    n, k = 40, 512
    raw, w = _matrix(qtype, n, k, seed=5)
    layer = BlockLinear.from_stored([(qtype, raw)], k)
    x = _input(130, k, seed=6)
    was = lib.rs_held_kquants(-1)
    try:
        outs = []
        for held in (0, 1):
            lib.rs_held_kquants(held)
            outs.append(layer(x))
            assert torch.equal(layer(x[3:4]), outs[-1][3:4])
            assert torch.equal(layer(x[100:130]), outs[-1][100:130])
    finally:
        lib.rs_held_kquants(was)
    assert torch.equal(outs[0], outs[1])
    assert _rel_err(outs[0], x.double() @ w.double().T) < REL_TOL
    assert lib.rs_held_kquants(-1) == was


@needs_native
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_rows_in_several_activation_chunks_are_the_rows_alone(qtype):
    """Many rows of a long K are taken in chunks of rows whose activations fit a core's L2
    (block_linear.cpp: 64 rows at K = 8192): rows across chunk edges and in the short last
    chunk are the bits they have alone or in a small batch, and close to the float result."""
    n, k, m = 40, 8192, 150
    raw, w = _matrix(qtype, n, k, seed=3)
    layer = BlockLinear.from_stored([(qtype, raw)], k)
    x = _input(m, k, seed=4)
    batched = layer(x)
    for i in (0, 63, 64, 65, 127, 128, 149):
        assert torch.equal(layer(x[i:i + 1]), batched[i:i + 1]), i
    assert torch.equal(layer(x[60:70]), batched[60:70])
    assert _rel_err(batched, x.double() @ w.double().T) < REL_TOL


@needs_native
def test_a_layer_of_mixed_types_is_its_parts_side_by_side():
    """A fused layer keeps one part per type (Q4_K_M's q/k in Q4_K, v in Q6_K): its output is
    exactly each part's own layer output, and consecutive parts of one type pack as one."""
    k = 512
    shards = [(T.Q4_K, *_matrix(T.Q4_K, 64, k, 3)), (T.Q4_K, *_matrix(T.Q4_K, 32, k, 4)),
              (T.Q6_K, *_matrix(T.Q6_K, 40, k, 5)), (T.Q8_0, *_matrix(T.Q8_0, 24, k, 6))]
    bias = torch.randn(sum(raw.shape[0] for _, raw, _ in shards))
    layer = BlockLinear.from_stored([(t, raw) for t, raw, _ in shards], k, bias)
    assert layer.types == ("Q4_K", "Q6_K", "Q8_0") and layer.out_features == 160
    x = _input(6, k)
    y = layer(x)
    row, pieces = 0, []
    for t, raw, _ in shards:
        n = raw.shape[0]
        pieces.append(BlockLinear.from_stored([(t, raw)], k, bias[row:row + n])(x))
        row += n
    assert torch.equal(y, torch.cat(pieces, dim=1))
    w = torch.cat([deq for _, _, deq in shards])
    assert _rel_err(y, x.double() @ w.double().T + bias.double()) < REL_TOL


@needs_native
def test_block_linear_refuses_what_does_not_fit():
    raw, _ = _matrix(T.Q4_K, 16, 256)
    with pytest.raises(ValueError, match="multiple of its block"):
        BlockLinear.from_stored([(T.Q4_K, raw[:, :72])], 128)
    with pytest.raises(ValueError, match="do not hold"):
        BlockLinear.from_stored([(T.Q4_K, raw[:, :100])], 256)
    with pytest.raises(ValueError, match="no block kernel for F32"):
        BlockLinear.from_stored([(T.F32, raw)], 256)
    with pytest.raises(ValueError, match="at least one"):
        BlockLinear.from_stored([], 256)


@needs_native
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 17, 48])
def test_native_repack_is_the_reference_layout_byte_for_byte(qtype, n):
    """block_pack.cpp against the torch statement of the layout, on quantized weights and on
    random bytes (every bit of every field and code), odd row counts included."""
    k = 512
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw, _ = _matrix(qtype, n, k, seed=n)
    noise = torch.from_numpy(np.random.default_rng(n).integers(0, 256, (n, k // block * size),
                                                                dtype=np.uint8))
    for rows in (raw, noise):
        assert torch.equal(pack(qtype, rows, k), reference_pack(qtype, rows, k))


@needs_native
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.F16, T.IQ4_XS],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [(32, 16, 48), (32, 16, 5), (17, 32)])
def test_stacked_matrices_pack_as_their_concatenation(qtype, rows):
    """A fused layer's matrices of one type packed one by one into their groups' place (or,
    where one would share a group of 16 rows with the next, concatenated first) give the
    bytes of packing their concatenation."""
    k = 256
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    gen = np.random.default_rng(sum(rows))
    parts = [torch.from_numpy(gen.integers(0, 256, (n, k // block * size), dtype=np.uint8))
             for n in rows]
    if qtype in HALF_TYPES:  # finite 16-bit values
        parts = [torch.randn(n, k).to(torch.float16 if qtype == T.F16 else torch.bfloat16)
                 .view(torch.uint8).reshape(n, -1) for n in rows]
    assert torch.equal(pack(qtype, parts, k), pack(qtype, torch.cat(parts), k))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_packed_size_is_about_the_file_size(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n, k = 4096, 4096
    stored = n * k // block * size
    assert stored <= packed_bytes(qtype, n, k) <= stored * 1.03  # K-quants: +1/36 per block


class _Reader:
    def __init__(self, qtype):
        t = type("Tensor", (), {"name": "blk.0.attn_q.weight", "tensor_type": qtype,
                                "shape": (64, 64)})
        self.tensors = [t]


@needs_native
def test_resolve_gguf():
    for qtype in (T.Q4_1, T.Q4_K, T.Q6_K, T.Q8_0):
        assert resolve_quantization("auto", CPU, _Reader(qtype)) == "gguf"
        assert resolve_quantization("gguf", CPU, _Reader(qtype)) == "gguf"
    assert resolve_quantization("auto", CPU, _Reader(T.F32)) == "none"
    assert resolve_quantization("int8", CPU, _Reader(T.Q4_K)) == "int8"
    with pytest.raises(ValueError, match="block-quantized"):
        resolve_quantization("gguf", CPU, _Reader(T.F32))
    with pytest.raises(ValueError, match="block-quantized"):
        resolve_quantization("gguf", CPU, None)
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("gguf", torch.device("cuda"), _Reader(T.Q4_K))


def _compare_steps(ours, ref, tol=MODEL_REL):
    tokens = [[(7 * i + 3) % ours.config.vocab_size for i in range(12)],
              [(5 * i + 1) % ours.config.vocab_size for i in range(7)]]
    paged = {"ours": PagedSeqs(tokens), "ref": PagedSeqs(tokens)}
    for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
        a = ours.all_logits([paged["ours"].chunk(i, n) for i, n in step])
        b = ref.all_logits([paged["ref"].chunk(i, n) for i, n in step])
        for x, y in zip(a, b):
            assert (x - y).abs().max() <= tol * y.abs().max()


def _assert_stored(model):
    """Every matrix is a BlockLinear and nothing else holds a float matrix."""
    layer = model.layers[0]
    for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
              layer.mlp.down_proj, model.lm_head):
        assert isinstance(m, BlockLinear)
    # a tied table is stored once: the embedding reads the head's packed rows
    kind = PackedEmbedding if model.config.tie_word_embeddings else StoredEmbedding
    assert isinstance(model.embed_tokens, kind)
    if model.config.tie_word_embeddings:
        assert model.embed_tokens.packed is model.lm_head.packed0
    assert all(p.dim() == 1 for p in model.parameters())
    assert all(b.dtype == torch.uint8 or b.dim() <= 1 or "rotary" in name
               for name, b in model.named_buffers())


@needs_native
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_legacy_gguf_model_matches_its_dequantized_weights(arch, tiny_gguf_files):
    """The float model on the same file holds exactly the weights the block layers read, so
    only the activations' rounding differs: chunked prefill and decode steps, Q/K rows
    unpermuted (llama), q/k/v bias (qwen2), q/k norms (qwen3)."""
    path = tiny_gguf_files(arch, "Q4_0")
    ours, ref = make_runner(path, quantization="gguf"), make_runner(path)
    _assert_stored(ours.model)
    _compare_steps(ours, ref)


@pytest.fixture(scope="module")
def k_quant_files(tmp_path_factory):
    """(arch → a Q4_K_M-like GGUF of a tiny model wide enough for K-quants: hidden 256)."""
    root = tmp_path_factory.mktemp("kquant")
    files = {}

    def get(arch):
        if arch not in files:
            hf = make_hf_model(arch, root / arch, hidden_size=256, intermediate_size=512,
                               head_dim=64, tie_word_embeddings=arch == "qwen2")
            files[arch] = hf_to_gguf(hf, root / f"{arch}.gguf", "Q4_K_M")
        return files[arch]
    return get


@needs_native
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_k_quant_model_matches_its_dequantized_weights(arch, k_quant_files):
    path = k_quant_files(arch)
    ours, ref = make_runner(path, quantization="gguf"), make_runner(path)
    _assert_stored(ours.model)
    attn = ours.model.layers[0].self_attn
    assert attn.qkv_proj.types == ("Q4_K", "Q6_K")  # q and k, then v
    assert ours.model.layers[0].mlp.down_proj.types == ("Q6_K",)
    _compare_steps(ours, ref, MODEL_REL_K)


@needs_native
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied, tied (the head's rows)
def test_stored_embedding_rows_are_the_dequantized_table(arch, k_quant_files):
    path = k_quant_files(arch)
    model = make_runner(path, quantization="gguf").model
    ids = torch.tensor([0, 5, 5, 17, 383])
    embd = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    table = dequantize(embd.data, embd.tensor_type, (model.config.vocab_size, 256))
    assert torch.equal(model.embed_tokens(ids), table[ids])
    assert torch.equal(model.embed_tokens.weight, table)
    if arch == "llama":  # its own table stays on the file's mapping: no copy in memory
        assert isinstance(model.embed_tokens, StoredEmbedding)
        assert mapped_file(model.embed_tokens.rows.data_ptr()) == str(path)
    plan = memory_plan((t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
                       for t in gguf.GGUFReader(str(path)).tensors)
    assert plan.embedding == (0 if arch == "qwen2" else int(embd.n_bytes))  # tied: the head's


@pytest.mark.parametrize("qtype", [*TYPES, *HALF_TYPES], ids=lambda t: t.name)
def test_gathered_packed_rows_are_the_dequantized_rows(qtype):
    """Every part type: rows read back from the packed layout (any lane of a group, the last
    group part padding) bit for bit the file's rows dequantized."""
    n, k = 37, 512
    if qtype in HALF_TYPES:
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
        raw = w.to(torch.float16 if qtype == T.F16 else torch.bfloat16).view(torch.uint8)
        ref = dequantize(raw, qtype, (n, k))
    else:
        raw, ref = _matrix(qtype, n, k)
    ids = torch.tensor([0, 5, 5, 15, 16, 31, 32, 36, 17])
    rows = gather_rows(qtype, pack(qtype, raw, k), k, ids)
    assert torch.equal(rows.view(torch.int32), ref[ids].view(torch.int32))
    assert gather_rows(qtype, pack(qtype, raw, k), k, ids[:0]).shape == (0, k)
