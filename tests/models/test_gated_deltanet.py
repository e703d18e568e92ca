"""The Gated DeltaNet token mixers (layers/gated_deltanet.py), both paths (the torch reference
and the native kernels, delta_rule.cpp): against transformers' Qwen3.5 functions, snapshots
equal to the state a split run has at that point, and the engine's rule, tested with
torch.equal: a sequence's outputs and final state do not depend on how its tokens are split
across calls nor on what else shares the call."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.nn import functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from radixserve.kernels import native, recurrent_ops
from radixserve.layers import gated_deltanet as gdn

HAS_NATIVE = native.load() is not None
# path -> (causal_conv, gated_delta_rule); "native" is the public entry with the library loaded
PATHS = {"torch": (gdn.causal_conv_reference, gdn.gated_delta_rule_reference),
         "native": (gdn.causal_conv, gdn.gated_delta_rule)}
path_param = pytest.mark.parametrize("path", [
    "torch", pytest.param("native", marks=pytest.mark.skipif(
        not HAS_NATIVE, reason="native kernels unavailable"))])
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="native kernels unavailable")
CONV_BIAS = torch.randn(20, generator=torch.Generator().manual_seed(11))  # _conv_case's width


def _op(path: str, which: str):
    """The op under test: "conv" (silu, no bias), "conv_bias" (a bias, no activation: LFM2's
    and Mamba2's variants together) or "delta"."""
    conv, rule = PATHS[path]
    if which == "conv_bias":
        return functools.partial(conv, bias=CONV_BIAS, activation=None)
    return conv if which == "conv" else rule


def _delta_inputs(gen: torch.Generator, rows: int, k_heads: int, v_heads: int, k_dim: int,
                  v_dim: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, g (log decays in [-0.7, 0]), beta (in (0, 1)) of ``rows`` tokens."""
    q = torch.randn(rows, k_heads, k_dim, generator=gen)
    k = torch.randn(rows, k_heads, k_dim, generator=gen)
    v = torch.randn(rows, v_heads, v_dim, generator=gen)
    g = -0.7 * torch.rand(rows, v_heads, generator=gen)
    beta = torch.rand(rows, v_heads, generator=gen).clamp(0.02, 0.98)
    return q, k, v, g, beta


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)


def _split_run(op, seqs: list[tuple[torch.Tensor, ...]], pool: torch.Tensor, rows: list[int],
               chunk: int, order: list[int], extra=()) -> list[torch.Tensor]:
    """Every sequence through ``op`` (an op with per-token inputs ``seqs[i]``, ``extra``
    arguments before the pool) in calls of up to ``chunk`` tokens of every unfinished
    sequence, batched in ``order``; sequence i in pool row ``rows[i]``. Its outputs, by
    sequence."""
    lens = [s[0].shape[0] for s in seqs]
    done, outs = [0] * len(seqs), [[] for _ in seqs]
    while any(d < n for d, n in zip(done, lens)):
        batch = [(i, done[i], min(lens[i], done[i] + chunk)) for i in order if done[i] < lens[i]]
        inputs = [torch.cat([seqs[i][j][a:b] for i, a, b in batch]) for j in range(len(seqs[0]))]
        out = op(*inputs, *extra, pool, _cu([b - a for _, a, b in batch]),
                 torch.tensor([rows[i] for i, _, _ in batch]))
        for (i, a, b), piece in zip(batch, out.split([b - a for _, a, b in batch])):
            outs[i].append(piece)
            done[i] = b
    return [torch.cat(o) for o in outs]


# -- against transformers ---------------------------------------------------------------------

@path_param
def test_conv_matches_transformers_fresh_and_carried(path):
    conv = PATHS[path][0]
    gen = torch.Generator().manual_seed(0)
    width, taps, lens = 24, 4, [5, 1, 13, 2]
    x = torch.randn(sum(lens), width, generator=gen)
    weight = torch.randn(width, taps, generator=gen) * 0.5
    pool = torch.zeros(6, taps - 1, width)
    pool[3:5] = torch.randn(2, taps - 1, width, generator=gen)  # seqs 1 and 2 carry a window
    windows = pool.clone()
    slots = torch.tensor([0, 3, 4, 1])
    out = conv(x, weight, pool, _cu(lens), slots)
    for b, (part, got) in enumerate(zip(x.split(lens), out.split(lens))):
        if b in (1, 2):
            state = windows[slots[b]].T[None].clone()
            want = hf.causal_conv1d_update(part.T[None], state, weight, activation="silu")
            torch.testing.assert_close(pool[slots[b]], state[0].T, rtol=0, atol=0)
        else:  # fresh, and shorter than the window at b=3
            want = hf.causal_conv1d_fn(part.T[None], weight, activation="silu")
            padded = torch.cat([torch.zeros(taps - 1, width), part])[-(taps - 1):]
            assert torch.equal(pool[slots[b]], padded)
        torch.testing.assert_close(got, want[0].T, rtol=1e-5, atol=1e-6)


@path_param
def test_delta_rule_matches_transformers_recurrent(path):
    """GVA (Hv = 2 Hk), odd lengths, one fresh state and one carried."""
    rule = PATHS[path][1]
    gen = torch.Generator().manual_seed(1)
    lens, dims = [9, 17], (2, 4, 16, 24)
    q, k, v, g, beta = _delta_inputs(gen, sum(lens), *dims)
    states = torch.zeros(3, 4, 16, 24)
    states[2] = torch.randn(4, 16, 24, generator=gen) * 0.3
    initial = states.clone()
    slots = torch.tensor([0, 2])
    out = rule(q, k, v, g, beta, states, _cu(lens), slots)
    for b, rows in enumerate(torch.arange(sum(lens)).split(lens)):
        want, final = hf.torch_recurrent_gated_delta_rule(
            q[rows][None], k[rows][None], v[rows][None], g[rows][None], beta[rows][None],
            initial_state=initial[slots[b]][None], output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[rows], want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(states[slots[b]], final[0], rtol=1e-5, atol=1e-5)


@path_param
def test_delta_rule_matches_transformers_chunked_prefill(path):
    rule = PATHS[path][1]
    gen = torch.Generator().manual_seed(2)
    rows, dims = 150, (1, 2, 32, 16)
    q, k, v, g, beta = _delta_inputs(gen, rows, *dims)
    states = torch.randn(1, 2, 32, 16, generator=gen) * 0.3
    want, final = hf.torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=states.clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    out = rule(q, k, v, g, beta, states, _cu([rows]), torch.tensor([0]))
    torch.testing.assert_close(out, want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states[0], final[0], rtol=1e-4, atol=1e-4)


@path_param
@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_bias_and_activation_match_torch_conv1d(path, activation):
    """act(conv1d(window ++ x) + bias), the bias added before the activation (transformers'
    Mamba2 conv1d with bias; LFM2's short conv without an activation)."""
    conv = PATHS[path][0]
    gen = torch.Generator().manual_seed(12)
    width, taps, lens = 24, 4, [6, 2]
    x = torch.randn(sum(lens), width, generator=gen)
    weight, bias = torch.randn(width, taps, generator=gen), torch.randn(width, generator=gen)
    pool = torch.randn(2, taps - 1, width, generator=gen)
    windows = pool.clone()
    out = conv(x, weight, pool, _cu(lens), torch.tensor([0, 1]), bias=bias,
               activation=activation)
    for b, (part, got) in enumerate(zip(x.split(lens), out.split(lens))):
        ext = torch.cat([windows[b], part]).T[None]
        want = F.conv1d(ext, weight[:, None], bias, groups=width)[0].T
        torch.testing.assert_close(got, F.silu(want) if activation else want, rtol=1e-5,
                                   atol=1e-5)
        assert torch.equal(pool[b], torch.cat([windows[b], part])[-(taps - 1):])


# -- snapshots and invariance ------------------------------------------------------------------

def _conv_case(gen):
    width, taps = 20, 4
    weight = torch.randn(width, taps, generator=gen)
    seqs = [(torch.randn(n, width, generator=gen),) for n in (70, 2, 33)]
    return seqs, (weight,), torch.zeros(8, taps - 1, width)


def _delta_case(gen):
    dims = (2, 4, 16, 72)  # the kernels' column blocks, whole and partial (masked at 16 lanes)
    seqs = [_delta_inputs(gen, n, *dims) for n in (70, 2, 33)]
    pool = torch.zeros(8, 4, 16, 72)
    return seqs, (), pool


@path_param
@pytest.mark.parametrize("which", ["conv", "conv_bias", "delta"])
def test_snapshots_equal_the_state_of_a_split_run(path, which):
    _check_snapshots(_op(path, which), which)


@path_param
@pytest.mark.parametrize("which", ["conv", "conv_bias", "delta"])
def test_outputs_and_states_do_not_depend_on_split_or_batch(path, which):
    _check_invariance(_op(path, which), which)


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_every_native_level_keeps_snapshots_and_invariance():
    for which in ("conv", "conv_bias", "delta"):
        _check_snapshots(_op("native", which), which)
        _check_invariance(_op("native", which), which)


def _check_snapshots(op, which: str) -> None:
    seqs, extra, pool = (_delta_case if which == "delta" else _conv_case)(torch.Generator()
                                                                          .manual_seed(3))
    pool[1] = torch.randn(pool.shape[1:], generator=torch.Generator().manual_seed(4)) * 0.3
    start = pool.clone()
    marks = [(0, 1), (0, 7), (0, 70), (1, 1), (2, 32)]  # (b, n): row 3 + k of the pool
    snaps = torch.tensor([(b, n, 3 + i) for i, (b, n) in enumerate(marks)])
    inputs = [torch.cat(parts) for parts in zip(*seqs)]
    lens = [s[0].shape[0] for s in seqs]
    op(*inputs, *extra, pool, _cu(lens), torch.tensor([0, 1, 2]), snaps)
    for i, (b, n) in enumerate(marks):
        alone = start.clone()
        op(*(t[:n] for t in seqs[b]), *extra, alone, _cu([n]), torch.tensor([b]))
        assert torch.equal(pool[3 + i], alone[b]), (b, n)


def _check_invariance(op, which: str) -> None:
    """Split sizes 1, 3, 7, 64 and whole; three sequences batched in two orders (other pool
    rows) against each alone in one call: torch.equal."""
    seqs, extra, pool = (_delta_case if which == "delta" else _conv_case)(torch.Generator()
                                                                          .manual_seed(5))
    pool[:3] = torch.randn(pool[:3].shape, generator=torch.Generator().manual_seed(6)) * 0.3
    start = pool.clone()
    whole = []  # each sequence alone, in one call
    for i, seq in enumerate(seqs):
        alone = start.clone()
        whole.append((_split_run(op, [seq], alone, [i], 10**6, [0], extra)[0], alone[i]))
    for chunk in (1, 3, 7, 64, 10**6):
        for order, rows in (([0, 1, 2], [0, 1, 2]), ([2, 0, 1], [5, 6, 7])):
            pool = start.clone()
            pool[rows] = start[:3]
            outs = _split_run(op, seqs, pool, rows, chunk, order, extra)
            for i, (out, state) in enumerate(whole):
                assert torch.equal(outs[i], out), (chunk, order, i)
                assert torch.equal(pool[rows[i]], state), (chunk, order, i)


# -- native against the reference; the edges ---------------------------------------------------

@functools.cache
def _reference_case(dims: tuple[int, int, int, int]) -> tuple[tuple, dict[str, torch.Tensor]]:
    """Inputs of three sequences (one snapshot), and what the torch reference makes of them
    (computed once for every kernel level)."""
    gen = torch.Generator().manual_seed(7)
    lens = [37, 1, 100]
    delta = _delta_inputs(gen, sum(lens), *dims)
    states = torch.randn(5, dims[1], dims[2], dims[3], generator=gen) * 0.3
    x, weight = torch.randn(sum(lens), 52, generator=gen), torch.randn(52, 4, generator=gen)
    windows = torch.randn(5, 3, 52, generator=gen)
    packed = (_cu(lens), torch.tensor([4, 0, 2]), torch.tensor([[2, 50, 1]]))
    bias = torch.randn(52, generator=gen)
    inputs = (delta, states, x, weight, bias, windows, packed)
    want = {"states": states.clone(), "windows": windows.clone()}
    want["delta"] = gdn.gated_delta_rule_reference(*delta, want["states"], *packed)
    want["conv"] = gdn.causal_conv_reference(x, weight, want["windows"], *packed)
    want["conv_bias"] = gdn.causal_conv_reference(x, weight, windows.clone(), *packed,
                                                  bias=bias, activation=None)
    return inputs, want


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("dims", [(16, 32, 128, 128), (2, 4, 16, 20), (1, 3, 41, 72)])
def test_native_matches_the_reference(dims):
    (delta, states, x, weight, bias, windows, packed), want = _reference_case(dims)
    states, windows = states.clone(), windows.clone()
    out = recurrent_ops.gated_delta_rule(*delta, states, *packed)
    torch.testing.assert_close(out, want["delta"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states, want["states"], rtol=1e-5, atol=1e-5)
    out = recurrent_ops.causal_conv(x, weight, windows, *packed)
    torch.testing.assert_close(out, want["conv"], rtol=1e-5, atol=1e-6)
    assert torch.equal(windows, want["windows"])  # copies of the inputs, exactly
    out = recurrent_ops.causal_conv(x, weight, _reference_case(dims)[0][5].clone(), *packed,
                                    bias, is_silu=False)
    torch.testing.assert_close(out, want["conv_bias"], rtol=1e-5, atol=1e-5)


@path_param
def test_bad_indices_are_value_errors(path):
    conv, rule = PATHS[path]
    gen = torch.Generator().manual_seed(8)
    q, k, v, g, beta = _delta_inputs(gen, 5, 1, 2, 8, 8)
    states, x, weight = torch.zeros(3, 2, 8, 8), torch.randn(5, 6), torch.randn(6, 4)
    windows = torch.zeros(3, 3, 6)
    cases = [(_cu([2, 2]), torch.tensor([0, 1]), None),  # 4 of 5 rows
             (_cu([2, 3]), torch.tensor([0, 3]), None),  # slot past the pool
             (_cu([2, 3]), torch.tensor([0, 1]), torch.tensor([[0, 3, 2]])),  # n past seq 0
             (_cu([2, 3]), torch.tensor([0, 1]), torch.tensor([[1, 1, 0]]))]  # dst in slots
    for cu, slots, snaps in cases:
        with pytest.raises(ValueError):
            rule(q, k, v, g, beta, states, cu, slots, snaps)
        with pytest.raises(ValueError):
            conv(x, weight, windows, cu, slots, snaps)


def test_inconsistent_shapes_are_value_errors():
    gen = torch.Generator().manual_seed(9)
    q, k, v, g, beta = _delta_inputs(gen, 4, 2, 3, 8, 8)  # 3 value heads for 2 key heads
    with pytest.raises(ValueError, match="disagree"):
        gdn.gated_delta_rule(q, k, v, g, beta, torch.zeros(1, 3, 8, 8), _cu([4]),
                             torch.tensor([0]))
    with pytest.raises(ValueError, match="disagree"):
        gdn.causal_conv(torch.randn(4, 6), torch.randn(6, 4), torch.zeros(1, 2, 6), _cu([4]),
                        torch.tensor([0]))
    with pytest.raises(ValueError, match="one more"):
        gdn.causal_conv(torch.randn(4, 6), torch.randn(6, 4), torch.zeros(1, 3, 6), _cu([4]),
                        torch.tensor([0, 0]))
    conv_args = (torch.randn(4, 6), torch.randn(6, 4), torch.zeros(1, 3, 6), _cu([4]),
                 torch.tensor([0]))
    with pytest.raises(ValueError, match="bias"):
        gdn.causal_conv(*conv_args, bias=torch.randn(5))
    for conv in PATHS.values():
        with pytest.raises(ValueError, match="activation"):
            conv[0](*conv_args, activation="gelu")


def test_half_precision_inputs_keep_their_dtype():
    gen = torch.Generator().manual_seed(10)
    q, k, v, g, beta = (t.bfloat16() for t in _delta_inputs(gen, 6, 1, 2, 8, 8))
    out = gdn.gated_delta_rule(q, k, v, g, beta, torch.zeros(1, 2, 8, 8), _cu([6]),
                               torch.tensor([0]))
    assert out.dtype == torch.bfloat16 and out.shape == (6, 2, 8)
    x = torch.randn(6, 4, generator=gen).bfloat16()
    out = gdn.causal_conv(x, torch.randn(4, 2).bfloat16(), torch.zeros(1, 1, 4), _cu([6]),
                          torch.tensor([0]))
    assert out.dtype == torch.bfloat16 and out.shape == (6, 4)


def test_without_the_kernels_the_reference_runs_with_one_warning(monkeypatch, caplog):
    info = native.KernelInfo(None, None, False, runnable=(), built=(), reason="not built")
    monkeypatch.setattr(native, "load", lambda: None)
    monkeypatch.setattr(native, "describe", lambda: info)
    monkeypatch.setattr(recurrent_ops, "causal_conv", None)  # never reached
    gdn._native_loaded.cache_clear()
    try:
        x, weight = torch.randn(3, 4), torch.randn(4, 2)
        for _ in range(2):
            out = gdn.causal_conv(x, weight, torch.zeros(1, 1, 4), _cu([3]), torch.tensor([0]))
            want = gdn.causal_conv_reference(x, weight, torch.zeros(1, 1, 4), _cu([3]),
                                             torch.tensor([0]))
            assert torch.equal(out, want)
    finally:
        gdn._native_loaded.cache_clear()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "torch reference" in warnings[0].getMessage()
