"""The native CPU kernels: which level loads (the best one, a forced one, none with a warning),
the switch that turns them off, and at every level this machine runs the int8 linear kernel
bit-identical to the torch path (so a row's result never depends on which path its batch size
picks, nor on the CPU level), RMSNorm, rotary and SiLU against torch."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels import native
from radixserve.layers import int8_linear
from radixserve.layers.int8_linear import Int8Linear

needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
pytestmark = pytest.mark.usefixtures("kernel_level")


@pytest.fixture
def fresh_load(monkeypatch):
    """``native.load`` as on a new process (its choice forgotten), the environment restored and
    the choice forgotten again afterwards."""
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    native.reset()
    yield native.load
    monkeypatch.undo()
    native.reset()


def _torch_path(weight: torch.Tensor, bias: torch.Tensor | None) -> Int8Linear:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(int8_linear, "_native_weight", lambda *args: None)
        return Int8Linear.from_float(weight, bias)


@needs_native
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (33, 17), (16, 4), (1, 3), (100, 130)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_linear_native_is_bit_identical_to_the_torch_path(shape, with_bias):
    gen = torch.Generator().manual_seed(sum(shape))
    n, k = shape
    w = torch.randn(n, k, generator=gen) * 0.05
    b = torch.randn(n, generator=gen) if with_bias else None
    fast, reference = Int8Linear.from_float(w, b), _torch_path(w, b)
    assert fast._native is not None and reference._native is None
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 31, 70):
        x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 5
        x[0, 0] = 0.0
        assert torch.equal(fast(x), reference(x)), (shape, m)
    zero = torch.zeros(2, k)
    assert torch.equal(fast(zero), reference(zero))


@needs_native
@pytest.mark.parametrize("amx", [True, False])
def test_a_row_is_the_same_alone_or_in_any_batch(amx):
    lib = native.load()
    gen = torch.Generator().manual_seed(1)
    lin = Int8Linear.from_float(torch.randn(80, 96, generator=gen), torch.randn(80, generator=gen))
    x = torch.randn(133, 96, generator=gen)
    big = lin(x)  # AMX tiles where the CPU has them
    try:
        lib.rs_init(amx)
        for i in (0, 7, 132):
            assert torch.equal(lin(x[i:i + 1]), big[i:i + 1])  # the VNNI path
        for m in (5, 8, 17, 130):
            assert torch.equal(lin(x[:m]), big[:m])
    finally:
        lib.rs_init(True)


@needs_native
def test_non_contiguous_input_and_empty_batch():
    lin = Int8Linear.from_float(torch.randn(24, 40))
    x = torch.randn(40, 6).t()
    assert torch.equal(lin(x), lin(x.contiguous()))
    assert lin(torch.empty(0, 40)).shape == (0, 24)


def test_the_switch_turns_the_kernels_off(fresh_load, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_NATIVE_KERNELS", "0")
    assert fresh_load() is None
    assert Int8Linear.from_float(torch.randn(8, 8))._native is None


def test_the_best_level_this_cpu_runs_is_loaded(fresh_load):
    lib, info = fresh_load(), native.describe()
    if lib is None:
        pytest.skip(f"no kernel library here: {info.reason}")
    assert info.level == [lv for lv in info.runnable if lv in info.built][0]
    assert lib.rs_level().decode() == info.level and info.path.endswith(".so")


@pytest.mark.parametrize("level", ["avxvnni", "avx2", "generic"])
def test_a_forced_level_loads_that_library(fresh_load, monkeypatch, level):
    info = native.describe()
    if level not in info.runnable or level not in info.built:
        pytest.skip(f"{level} is not runnable and built here")
    monkeypatch.setenv(native.ISA_ENV, level)
    native.reset()
    assert fresh_load().rs_level().decode() == level
    assert native.describe().level == level and "forced" in native.describe().reason


def test_a_level_the_cpu_cannot_run_is_refused(fresh_load, monkeypatch):
    monkeypatch.setattr(native, "cpu_flags", lambda: {"sse2"})  # an old x86-64 CPU
    monkeypatch.setenv(native.ISA_ENV, "avx2")
    if "avx2" not in native._levels.levels_for(native.platform.machine()):
        pytest.skip("not an x86-64 machine")
    with pytest.raises(native.UnsupportedLevel, match="this CPU lacks avx"):
        fresh_load()
    monkeypatch.setenv(native.ISA_ENV, "avx9000")
    native.reset()
    with pytest.raises(native.UnsupportedLevel, match="not a level of this machine"):
        fresh_load()


def test_a_missing_library_warns_and_leaves_the_torch_path(fresh_load, monkeypatch, caplog):
    monkeypatch.setattr(native, "library_path", lambda level: None)
    with caplog.at_level("WARNING", logger=native.__name__):
        assert fresh_load() is None
    assert "torch paths run instead" in caplog.text and "pip install" in caplog.text
    assert native.describe().level is None and native.describe().built == ()


@needs_native
def test_a_stale_library_is_not_used(fresh_load, monkeypatch, caplog):
    monkeypatch.setattr(native._levels, "source_hash", lambda folder: "0123456789abcdef")
    with caplog.at_level("WARNING", logger=native.__name__):
        assert fresh_load() is None
    assert "built from other sources" in caplog.text


@needs_native
def test_the_best_level_not_built_falls_to_the_next(fresh_load, monkeypatch):
    best = native.describe().level
    real = native.library_path
    monkeypatch.setattr(native, "library_path", lambda level: None if level == best else real(level))
    native.reset()
    lib = fresh_load()
    if len(native.describe().runnable) < 2:
        assert lib is None
        return
    assert native.describe().level == native.describe().runnable[1]
    assert "is not built" in native.describe().reason


def _native(module, on=True):
    """``module`` with its native kernel on (as a float32 CPU model's ``KernelPlan`` sets it)
    or off."""
    module.native = on
    return module


def _without_native(module):
    return _native(module, on=False)


@needs_native
@pytest.mark.parametrize("dim", [576, 64, 40, 3])
def test_rms_norm_native_matches_torch(dim):
    from radixserve.layers.norm import RMSNorm

    gen = torch.Generator().manual_seed(dim)
    norm, reference = _native(RMSNorm(dim, 1e-5)), _without_native(RMSNorm(dim, 1e-5))
    weight = torch.randn(dim, generator=gen)
    norm.weight.data.copy_(weight)
    reference.weight.data.copy_(weight)
    x = torch.randn(37, dim, generator=gen) * 3
    torch.testing.assert_close(norm(x), reference(x), rtol=2e-6, atol=1e-6)
    residual = torch.randn(37, dim, generator=gen)
    want, want_sum = reference(x, residual.clone())
    got, got_sum = norm(x, residual.clone())
    assert torch.equal(got_sum, want_sum)  # the add is one rounding either way
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    assert torch.equal(norm(x[5:6]), norm(x)[5:6])  # a row alone or in a batch


@needs_native
def test_rotary_native_is_bit_identical_to_torch():
    from radixserve.layers.rotary import RotaryEmbedding

    rope = _native(RotaryEmbedding(64, 4096, 10000.0, None))
    reference = _without_native(RotaryEmbedding(64, 4096, 10000.0, None))
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(19, (9 + 3 + 3) * 64, generator=gen)
    q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1)
    q, k = q.view(19, 9, 64), k.view(19, 3, 64)  # row-strided views, as the model has them
    positions = torch.randint(0, 4096, (19,), generator=gen)
    want_q, want_k = reference(positions, q.clone(), k.clone())
    got_q, got_k = rope(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr()  # rotated in place
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@needs_native
def test_silu_and_mul_native_matches_torch():
    from torch.nn import functional as F

    from radixserve.layers.activation import silu_and_mul

    x = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(3999) * 4]).view(4, 2000)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(x, native=True), F.silu(gate) * up, rtol=1e-6, atol=1e-6)


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_gelu_tanh_and_mul_native_matches_torch():
    """GeGLU as x / (1 + exp(-2c (x + 0.044715 x^3))) (layer_ops.cpp): torch's tanh formula to
    float rounding at each level (where torch's 1 + tanh cancels to 0, for gates below about
    -5, ours keeps the tail: ~1e-6 absolute); a row alone as in its batch."""
    from torch.nn import functional as F

    from radixserve.layers.activation import gelu_tanh_and_mul

    x = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(3999) * 4]).view(4, 2000)
    gate, up = x.chunk(2, dim=-1)
    want = F.gelu(gate, approximate="tanh") * up
    got = gelu_tanh_and_mul(x, native=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=2e-6)
    assert torch.equal(gelu_tanh_and_mul(x[2:3], native=True), got[2:3])
    edges = torch.tensor([[0.0, 1e-30, -200.0, 200.0, 1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(gelu_tanh_and_mul(edges, native=True), torch.tensor([[0.0, 5e-31, -0.0, 200.0]]))


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_head_norms_native_match_torch_and_the_row_kernel():
    """q/k norms on a row-strided [T, heads, d] view of a fused qkv output: each head as the
    row kernel norms a row (same bits), torch's to float rounding."""
    from radixserve.layers.norm import RMSNorm

    gen = torch.Generator().manual_seed(1)
    norm, reference = _native(RMSNorm(16, 1e-6)), _without_native(RMSNorm(16, 1e-6))
    weight = 1 + torch.randn(16, generator=gen)
    norm.weight.data.copy_(weight)
    reference.weight.data.copy_(weight)
    qkv = torch.randn(33, (4 + 2 + 2) * 16, generator=gen) * 3
    q = qkv[:, :64].view(33, 4, 16)
    got = norm(q)
    assert got.is_contiguous() and torch.equal(qkv[:, :64].view(33, 4, 16), q)  # not in place
    assert torch.equal(got.view(-1, 16), norm(q.reshape(-1, 16)))
    torch.testing.assert_close(got, reference(q), rtol=2e-6, atol=1e-6)
    assert torch.equal(norm(q[7:8]), got[7:8])


@pytest.mark.parametrize("features,runnable", [({"fp", "asimd", "asimddp"}, ("dotprod", "generic")),
                                               ({"fp", "asimd"}, ("generic",))], ids=["dp", "v8"])
def test_aarch64_runs_dotprod_where_the_cpu_lists_asimddp(monkeypatch, features, runnable):
    """/proc/cpuinfo's Features on an Arm CPU pick the levels (kernels/levels.py: ARM_LEVELS);
    no library of them is built on this machine, so the torch paths would run."""
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(native, "cpu_flags", lambda: features)
    monkeypatch.setattr(native, "library_path", lambda level: None)
    monkeypatch.delenv(native.ISA_ENV, raising=False)  # the module's kernel_level forces one
    native.reset()
    try:
        info = native.describe()
        assert info.runnable == runnable and info.cpu_flags == tuple(sorted(features & {"asimddp"}))
    finally:
        native.reset()
