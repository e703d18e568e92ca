"""The Mamba2 (SSD) ops and mixer (layers/mamba2.py), both paths (the torch reference and the
native kernels, ssd_scan.cpp): the mixer against transformers' own Granite 4.0-H and Nemotron-H
mixers (their chunked torch path) through prefill, decode steps and chunks; the scan's native
kernels against the reference at every level; snapshots and the engine's rule (torch.equal: a
sequence's outputs and final state do not depend on its split nor on what shares the call)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from transformers import GraniteMoeHybridConfig, NemotronHConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    GraniteMoeHybridMambaLayer,
)
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

from radixserve.kernels import native
from radixserve.layers import gated_deltanet as gdn
from radixserve.layers import mamba2
from radixserve.layers.forward_context import ForwardContext, forward_context
from radixserve.model_config import ModelConfig
from radixserve.recurrent_params import LINEAR, Mamba2Params, ShortConvParams
from radixserve.runner.recurrent_state import StepStates

HAS_NATIVE = native.load() is not None
path_param = pytest.mark.parametrize("path", [
    "torch", pytest.param("native", marks=pytest.mark.skipif(
        not HAS_NATIVE, reason="native kernels unavailable"))])
needs_native = pytest.mark.skipif(not HAS_NATIVE, reason="native kernels unavailable")
SCAN = {"torch": mamba2.mamba2_scan_reference, "native": mamba2.mamba2_scan}
HEADS, HEAD_DIM, STATE, GROUPS, TAPS = 8, 16, 16, 2, 4


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)


# -- the mixer against transformers -------------------------------------------------------------

def _hf_mixer(family: str, limit: tuple[float, float], proj_bias: bool) -> torch.nn.Module:
    """transformers' mixer (chunk size 8: prefill spans chunks) with random weights."""
    shape = {"hidden_size": 64, "num_hidden_layers": 1, "time_step_limit": limit}
    if family == "granite":
        cfg = GraniteMoeHybridConfig(
            **shape, rms_norm_eps=1e-5, mamba_n_heads=HEADS, mamba_d_head=HEAD_DIM, mamba_expand=2,
            mamba_d_state=STATE, mamba_n_groups=GROUPS, mamba_d_conv=TAPS,
            mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=proj_bias)
        mixer = GraniteMoeHybridMambaLayer(cfg, 0)
    else:
        cfg = NemotronHConfig(
            **shape, layer_types=["mamba"], layer_norm_epsilon=1e-5, mamba_num_heads=HEADS,
            mamba_head_dim=HEAD_DIM, ssm_state_size=STATE, n_groups=GROUPS, conv_kernel=TAPS,
            chunk_size=8, use_conv_bias=True, use_bias=proj_bias)
        mixer = NemotronHMamba2Mixer(cfg, 0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in mixer.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "conv" in name else 0.2))
        mixer.A_log.copy_(torch.rand(HEADS, generator=gen) * 1.5)
        mixer.dt_bias.copy_(torch.randn(HEADS, generator=gen) - 1.0)
        mixer.norm.weight.add_(1.0)
    return mixer.eval()


def _our_mixer(hf: torch.nn.Module, limit: tuple[float, float], proj_bias: bool,
               is_native: bool) -> mamba2.Mamba2Mixer:
    layout = Mamba2Params(layer_types=(LINEAR,), num_heads=HEADS, head_dim=HEAD_DIM,
                          state_size=STATE, n_groups=GROUPS, conv_kernel=TAPS,
                          time_step_limit=limit, conv_bias=True, proj_bias=proj_bias)
    cfg = ModelConfig(architecture="test", vocab_size=32, hidden_size=64, num_layers=1,
                      num_heads=4, num_kv_heads=4, head_dim=16, intermediate_size=128,
                      rms_norm_eps=1e-5, linear_attn=layout)
    mixer = mamba2.Mamba2Mixer(cfg, 0)
    mixer.load_state_dict(hf.state_dict())  # strict: transformers' names, every one
    mixer.norm.native = is_native
    return mixer


def _run(mixer: mamba2.Mamba2Mixer, pool: tuple[torch.Tensor, torch.Tensor],
         pieces: list[torch.Tensor], slots: list[int],
         snapshots: torch.Tensor | None = None) -> list[torch.Tensor]:
    """One call of the mixer on ``pieces`` (one per sequence, in pool rows ``slots``)."""
    states = StepStates(conv={0: pool[0]}, ssm={0: pool[1]},
                        cu_seqlens=_cu([len(p) for p in pieces]), slots=torch.tensor(slots),
                        snapshots=snapshots)
    ctx = ForwardContext(None, [], None, [], states=states)
    with forward_context(ctx), torch.no_grad():
        out = mixer(torch.zeros(0), torch.cat(pieces))
    return list(out.split([len(p) for p in pieces]))


def _pool(slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    conv_dim = HEADS * HEAD_DIM + 2 * GROUPS * STATE
    return (torch.zeros(slots, TAPS - 1, conv_dim),
            torch.zeros(slots, HEADS, HEAD_DIM, STATE))


@path_param
@pytest.mark.parametrize("family,limit,proj_bias", [
    ("granite", (0.0, math.inf), False), ("nemotron", (0.05, 0.8), True)])
def test_mixer_matches_transformers(path, family, limit, proj_bias, monkeypatch):
    """One sequence of 37 tokens: a prefill of 13, 4 decode steps, then chunks of 5 (each call
    beside an unrelated sequence); all within 1e-4 of transformers' mixer run over the whole
    sequence (its chunked SSD form: the recurrence equals it to rounding)."""
    if path == "torch":
        monkeypatch.setattr(gdn, "use_native", lambda *_: False)
        monkeypatch.setattr(mamba2, "use_native", lambda *_: False)
    hf = _hf_mixer(family, limit, proj_bias)
    ours = _our_mixer(hf, limit, proj_bias, path == "native")
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1))
    other = torch.randn(37, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(x[None])[0]
    pool, got, done = _pool(3), [], 0
    for size in [13, 1, 1, 1, 1] + [5] * 4:
        got.append(_run(ours, pool, [other[done:done + size], x[done:done + size]], [0, 2])[1])
        done += size
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)


@path_param
def test_mixer_resumes_from_a_snapshot(path, monkeypatch):
    """Snapshots of both states (conv window, scan state) after 9 tokens: a sequence resumed
    from them gives what running straight through gives."""
    if path == "torch":
        monkeypatch.setattr(gdn, "use_native", lambda *_: False)
        monkeypatch.setattr(mamba2, "use_native", lambda *_: False)
    ours = _our_mixer(_hf_mixer("granite", (0.0, math.inf), False), (0.0, math.inf), False,
                      path == "native")
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(3))
    pool = _pool(3)
    through = _run(ours, pool, [x[:15]], [0], torch.tensor([[0, 9, 2]]))[0]
    pool[0][1], pool[1][1] = pool[0][2], pool[1][2]  # restore the snapshot into slot 1
    resumed = _run(ours, pool, [x[9:15]], [1])[0]
    # to rounding: the linears see other batches (the exact rule: the scan tests below)
    torch.testing.assert_close(resumed, through[9:], rtol=1e-5, atol=1e-5)
    for states in pool:
        torch.testing.assert_close(states[1], states[0], rtol=1e-5, atol=1e-5)


def test_mixer_needs_a_mamba2_layout():
    cfg = ModelConfig(architecture="test", vocab_size=32, hidden_size=64, num_layers=1,
                      num_heads=4, num_kv_heads=4, head_dim=16, intermediate_size=128,
                      linear_attn=ShortConvParams(layer_types=(LINEAR,), conv_dim=64))
    with pytest.raises(TypeError, match="Mamba2Params"):
        mamba2.Mamba2Mixer(cfg, 0)


# -- the scan: snapshots, invariance, native against the reference ------------------------------

def _scan_inputs(gen: torch.Generator, rows: int, heads: int, head_dim: int, groups: int,
                 state: int) -> tuple[torch.Tensor, ...]:
    """x (a view of wider rows, as the mixer's), dt (raw), B, C: per-token inputs."""
    wide = torch.randn(rows, heads * head_dim + 3, generator=gen)
    x = wide[:, 3:].view(rows, heads, head_dim)
    dt = torch.randn(rows, heads, generator=gen)
    B = torch.randn(rows, groups, state, generator=gen)
    C = torch.randn(rows, groups, state, generator=gen)
    return x, dt, B, C


def _scan_params(gen: torch.Generator, heads: int) -> tuple[torch.Tensor, ...]:
    """A, D, dt_bias: per-layer inputs."""
    return (-torch.rand(heads, generator=gen) * 2 - 0.05, torch.randn(heads, generator=gen),
            torch.randn(heads, generator=gen) - 1)


def _scan_op(path: str, params: tuple[torch.Tensor, ...], limit=(0.0, math.inf)):
    """The scan as an op of (x, dt, B, C, states, cu_seqlens, slots, snapshots)."""
    A, D, dt_bias = params

    def op(x, dt, B, C, states, cu_seqlens, slots, snapshots=None):
        return SCAN[path](x, dt, A, B, C, D, dt_bias, states, cu_seqlens, slots, snapshots,
                          limit)
    return op


DIMS = (4, 6, 2, 20)  # heads, head dim (4 rows and a single one), groups, state (a tail)


def _case(seed: int):
    gen = torch.Generator().manual_seed(seed)
    seqs = [_scan_inputs(gen, n, *DIMS) for n in (40, 2, 19)]
    pool = torch.zeros(8, DIMS[0], DIMS[1], DIMS[3])
    pool[:3] = torch.randn(3, DIMS[0], DIMS[1], DIMS[3], generator=gen) * 0.3
    return seqs, _scan_params(gen, DIMS[0]), pool


def _split_run(op, seqs, pool, rows: list[int], chunk: int, order: list[int]):
    """Each sequence through ``op`` in calls of up to ``chunk`` tokens of every unfinished
    sequence, batched in ``order``; its outputs, by sequence."""
    done, outs = [0] * len(seqs), [[] for _ in seqs]
    while any(d < len(s[0]) for d, s in zip(done, seqs)):
        batch = [(i, done[i], min(len(seqs[i][0]), done[i] + chunk)) for i in order
                 if done[i] < len(seqs[i][0])]
        inputs = [torch.cat([seqs[i][j][a:b] for i, a, b in batch]) for j in range(4)]
        out = op(*inputs, pool, _cu([b - a for _, a, b in batch]),
                 torch.tensor([rows[i] for i, _, _ in batch]))
        for (i, a, b), piece in zip(batch, out.split([b - a for _, a, b in batch])):
            outs[i].append(piece)
            done[i] = b
    return [torch.cat(o) for o in outs]


def _check_snapshots_and_invariance(path: str) -> None:
    seqs, params, start = _case(4)
    op = _scan_op(path, params, (0.01, 2.0))
    whole = []  # each sequence alone, in one call
    for i, seq in enumerate(seqs):
        alone = start.clone()
        whole.append((_split_run(op, [seq], alone, [i], 10**6, [0])[0], alone[i]))
    for chunk, order, rows in ((1, [0, 1, 2], [0, 1, 2]), (3, [2, 0, 1], [5, 6, 7]),
                               (16, [1, 2, 0], [5, 6, 7]), (10**6, [2, 1, 0], [0, 1, 2])):
        pool = start.clone()
        pool[rows] = start[:3]
        outs = _split_run(op, seqs, pool, rows, chunk, order)
        for i, (out, state) in enumerate(whole):
            assert torch.equal(outs[i], out), (path, chunk, order, i)
            assert torch.equal(pool[rows[i]], state), (path, chunk, order, i)
    # snapshots: the state of a run of the first n tokens, and a run resumed there
    pool, marks = start.clone(), [(0, 1), (0, 17), (0, 40), (1, 2), (2, 18)]
    inputs = [torch.cat(parts) for parts in zip(*seqs)]
    op(*inputs, pool, _cu([40, 2, 19]), torch.tensor([0, 1, 2]),
       torch.tensor([(b, n, 3 + k) for k, (b, n) in enumerate(marks)]))
    for k, (b, n) in enumerate(marks):
        alone = start.clone()
        op(*(t[:n] for t in seqs[b]), alone, _cu([n]), torch.tensor([b]))
        assert torch.equal(pool[3 + k], alone[b]), (path, b, n)
        resumed = op(*(t[n:] for t in seqs[b]), pool, _cu([len(seqs[b][0]) - n]),
                     torch.tensor([3 + k]))
        assert torch.equal(resumed, whole[b][0][n:]), (path, b, n)


@path_param
def test_scan_snapshots_and_invariance(path):
    _check_snapshots_and_invariance(path)


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_every_native_level_keeps_snapshots_and_invariance():
    _check_snapshots_and_invariance("native")


@functools.cache
def _reference(dims: tuple[int, int, int, int], limit: tuple[float, float]):
    """Three sequences (one snapshot) and what the torch reference makes of them."""
    gen = torch.Generator().manual_seed(5)
    lens = [37, 1, 70]
    x, dt, B, C = _scan_inputs(gen, sum(lens), *dims)
    params = _scan_params(gen, dims[0])
    states = torch.randn(5, dims[0], dims[1], dims[3], generator=gen) * 0.3
    packed = (_cu(lens), torch.tensor([4, 0, 2]), torch.tensor([[2, 50, 1]]))
    want_states = states.clone()
    want = _scan_op("torch", params, limit)(x, dt, B, C, want_states, *packed)
    return (x, dt, B, C, params, states, packed), (want, want_states)


@needs_native
@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("dims,limit", [((8, 64, 1, 128), (0.0, math.inf)),
                                        ((6, 5, 3, 20), (0.1, 0.5))])
def test_native_scan_matches_the_reference(dims, limit):
    (x, dt, B, C, params, states, packed), (want, want_states) = _reference(dims, limit)
    states = states.clone()
    out = _scan_op("native", params, limit)(x, dt, B, C, states, *packed)
    scale = want.abs().max().item()  # ~15 to ~200 here (slowly decaying states)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(states, want_states, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.usefixtures("kernel_level")
def test_native_gated_norm_matches_torch_and_ignores_the_batch():
    gen = torch.Generator().manual_seed(6)
    y, wide = torch.randn(9, 96, generator=gen), torch.randn(9, 100, generator=gen) * 3
    z, weight = wide[:, 4:], torch.randn(96, generator=gen)
    norm = mamba2.GatedGroupRMSNorm(96, 24, 1e-5)
    norm.weight.data.copy_(weight)
    want = norm(y, z)
    norm.native = True
    got = norm(y, z)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for row in (0, 4, 8):
        assert torch.equal(norm(y[row:row + 1], z[row:row + 1]), got[row:row + 1])


# -- the edges ----------------------------------------------------------------------------------

@path_param
def test_bad_shapes_and_indices_are_value_errors(path):
    gen = torch.Generator().manual_seed(7)
    x, dt, B, C = _scan_inputs(gen, 5, 4, 6, 2, 8)
    A, D, dt_bias = _scan_params(gen, 4)
    states, ok = torch.zeros(3, 4, 6, 8), (_cu([2, 3]), torch.tensor([0, 1]))
    bad_shapes = [(x, dt, A, B[:, :1].repeat(1, 3, 1), C, D, dt_bias, states),  # 3 groups
                  (x, dt[:, :3], A, B, C, D, dt_bias, states),
                  (x, dt, A[:3], B, C, D, dt_bias, states),
                  (x, dt, A, B, C, D, dt_bias, torch.zeros(3, 4, 6, 9)),
                  (x, dt, A, B, C, D, dt_bias, states.double()),
                  (x[0], dt, A, B, C, D, dt_bias, states)]
    for args in bad_shapes:  # checked by the public entry, before either path
        with pytest.raises(ValueError):
            mamba2.mamba2_scan(*args, *ok)
    with pytest.raises(ValueError, match="int64"):
        mamba2.mamba2_scan(x, dt, A, B, C, D, dt_bias, states, ok[0], ok[1].int())
    bad_indices = [(_cu([2, 2]), torch.tensor([0, 1]), None),  # 4 of 5 rows
                   (_cu([2, 3]), torch.tensor([0, 3]), None),  # slot past the pool
                   (_cu([2, 3]), torch.tensor([0, 1]), torch.tensor([[0, 3, 2]])),  # n > 2
                   (_cu([2, 3]), torch.tensor([0, 1]), torch.tensor([[1, 1, 0]]))]  # in slots
    for packed in bad_indices:
        with pytest.raises(ValueError):
            SCAN[path](x, dt, A, B, C, D, dt_bias, states, *packed)


def test_half_precision_inputs_keep_their_dtype():
    gen = torch.Generator().manual_seed(8)
    x, dt, B, C = (t.bfloat16() for t in _scan_inputs(gen, 6, 2, 4, 1, 8))
    A, D, dt_bias = _scan_params(gen, 2)
    out = mamba2.mamba2_scan(x, dt, A, B, C, D, dt_bias, torch.zeros(1, 2, 4, 8), _cu([6]),
                             torch.tensor([0]))
    assert out.dtype == torch.bfloat16 and out.shape == (6, 2, 4)
