"""The two token mixers of a Gated DeltaNet layer (Qwen3.5 / Qwen3-Next "linear attention"),
over a packed batch of sequences, each with its state in a row of a pool:

* ``causal_conv``: a causal depthwise convolution (plus a bias, then silu, by default; the
  activation is optional for other families); the pool row keeps the sequence's last K-1
  inputs between calls.
* ``gated_delta_rule``: the gated delta rule (transformers' ``torch_recurrent_gated_delta_rule``
  with ``use_qk_l2norm_in_kernel=True``); the pool row is the fp32 state [Hv, Dk, Dv].

Packed layout, both ops::

    rows        [ seq 0 ........ | seq 1 ... | seq 2 ...... ]    T rows
    cu_seqlens  0                c1          c2             T
    slots       s0               s1          s2                   pool rows, updated in place

``snapshots`` (optional, int64 [N, 3], rows (b, n, dst)): after the call, pool row ``dst`` holds
sequence b's state as it was after its first n tokens of this call (1 <= n <= its length):
what a later call resuming there needs (the prefix cache). ``dst`` is never one of ``slots``.

NOTE: the engine's rule: a sequence's outputs and final state are bitwise the same however its
tokens are split across calls and whatever else shares the call. So nothing here reduces or
exponentiates over a tensor whose shape or layout depends on the split or the batch: the torch
reference walks each sequence token by token on fixed-shape tensors ([C] rows, [Hv] decays,
[Hv, Dk, Dv] states), sums over Dk as a fixed pairwise tree of exact adds, and everything else
is exact elementwise arithmetic. The native kernels (kernels/delta_rule.cpp) keep the same rule
in their own float order: they match the reference to rounding, never bitwise. The caller's
g and beta must keep the rule too: torch's sigmoid, softplus and silu round a value
differently in a vector's body and in the scalar tail, so over a [T, Hv] tensor a token's
result can depend on where the split put it.

Which path runs is decided per call: the native kernels for CPU tensors with float32 pools when
the library is loaded (logged once), else the reference (a WARNING once where the library is
unavailable: it is a Python loop per token).
"""

from __future__ import annotations

import logging
from functools import cache

import torch
from torch.nn import functional as F

from radixserve.kernels import native, recurrent_ops

logger = logging.getLogger(__name__)

L2NORM_EPS = 1e-6  # transformers' l2norm (as the FLA kernels)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                cu_seqlens: torch.Tensor, slots: torch.Tensor,
                snapshots: torch.Tensor | None = None, *, bias: torch.Tensor | None = None,
                activation: str | None = "silu") -> torch.Tensor:
    """``act(causal depthwise conv(x) + bias)`` [T, C] in x's dtype; x [T, C], weight [C, K],
    bias [C] or None (none added), ``activation`` "silu" or None (the conv's output as it is);
    conv_states [S, K-1, C]: row ``slots[b]`` is sequence b's window (its last K-1 inputs
    before this call, oldest first; zeros for a fresh sequence, zeroed by the caller),
    replaced IN PLACE by its last K-1 inputs after the call. Inputs are rounded to the pool's
    dtype before the convolution, so a window read back in a later call is what this call used.
    ValueError for inconsistent shapes or indices, or an unknown activation."""
    _check_conv(x, weight, conv_states, cu_seqlens, slots, snapshots, bias, activation)
    if use_native(x, conv_states):
        out = recurrent_ops.causal_conv(
            x.float().contiguous(), weight.float().contiguous(), conv_states, cu_seqlens, slots,
            snapshots, None if bias is None else bias.float().contiguous(), activation == "silu")
        return out.to(x.dtype)
    return causal_conv_reference(x, weight, conv_states, cu_seqlens, slots, snapshots,
                                 bias=bias, activation=activation)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, states: torch.Tensor, cu_seqlens: torch.Tensor,
                     slots: torch.Tensor, snapshots: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule, token by token: q, k [T, Hk, Dk] (not normalized: l2-normalized
    here, q then scaled by Dk ** -0.5), v [T, Hv, Dv], g (log decay, <= 0) and beta [T, Hv];
    key head h serves value heads h*Hv/Hk .. (h+1)*Hv/Hk - 1. ``states`` [S, Hv, Dk, Dv]
    float32, row ``slots[b]`` sequence b's state, updated IN PLACE. Per token::

        S *= exp(g);  delta = (v - S^T k) * beta;  S += k delta^T;  out = S^T q

    Returns out [T, Hv, Dv] in v's dtype. ValueError for inconsistent shapes or indices."""
    _check_delta(q, k, v, g, beta, states, cu_seqlens, slots, snapshots)
    if use_native(q, states):
        out = recurrent_ops.gated_delta_rule(
            heads_contiguous(q), heads_contiguous(k), heads_contiguous(v),
            g.float().contiguous(), beta.float().contiguous(),
            states, cu_seqlens, slots, snapshots)
        return out.to(v.dtype)
    return gated_delta_rule_reference(q, k, v, g, beta, states, cu_seqlens, slots, snapshots)


# -- the torch reference ---------------------------------------------------------------------

def causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                          cu_seqlens: torch.Tensor, slots: torch.Tensor,
                          snapshots: torch.Tensor | None = None, *,
                          bias: torch.Tensor | None = None,
                          activation: str | None = "silu") -> torch.Tensor:
    """``causal_conv`` in torch (any device); the same contract."""
    _check_activation(activation)
    (num_rows, width), num_taps = x.shape, weight.shape[1]
    check_indices("causal_conv", num_rows, conv_states.shape[0], cu_seqlens, slots, snapshots)
    hist, dev = num_taps - 1, x.device
    # ext: per sequence its old window then its tokens; token t's taps are ext rows
    # base[t] .. base[t] + K-1, and a window after n tokens is rows start + n .. start + n+K-2
    #   ext  [ win 0 | tokens 0 ...... | win 1 | tokens 1 ... ]
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    ext_start = torch.cumsum(lens + hist, 0) - (lens + hist)
    taps = torch.arange(hist, device=dev)
    ext = torch.empty(int(lens.sum()) + hist * len(slots), width, device=dev)
    ext[(ext_start[:, None] + taps).reshape(-1)] = conv_states[slots].reshape(-1, width).float()
    seq = torch.repeat_interleave(torch.arange(len(slots), device=dev), lens)
    base = ext_start[seq] + torch.arange(num_rows, device=dev) - cu_seqlens[:-1][seq]
    ext[base + hist] = x.to(conv_states.dtype).float()
    w = weight.float()
    acc = ext[base] * w[:, 0]
    for j in range(1, num_taps):
        acc = acc + ext[base + j] * w[:, j]
    if bias is not None:
        acc = acc + bias.float()
    for row in acc if activation == "silu" else ():
        F.silu(row, inplace=True)  # NOTE: row by row: exp must not depend on a row's place
    if snapshots is not None and len(snapshots):
        b, n, dst = snapshots.unbind(1)
        conv_states[dst] = ext[(ext_start[b] + n)[:, None] + taps].to(conv_states.dtype)
    conv_states[slots] = ext[(ext_start + lens)[:, None] + taps].to(conv_states.dtype)
    return acc.to(x.dtype)


def gated_delta_rule_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                               cu_seqlens: torch.Tensor, slots: torch.Tensor,
                               snapshots: torch.Tensor | None = None) -> torch.Tensor:
    """``gated_delta_rule`` in torch (any device): a Python loop per sequence and token."""
    check_indices("gated_delta_rule", q.shape[0], states.shape[0], cu_seqlens, slots,
                   snapshots)
    group = v.shape[1] // k.shape[1]
    qn = (_l2norm(q.float()) * q.shape[2] ** -0.5).repeat_interleave(group, 1)
    kn = _l2norm(k.float()).repeat_interleave(group, 1)
    vf, decay, bf = v.float(), g.float().contiguous(), beta.float()
    out = torch.empty(v.shape, device=v.device)
    bounds, rows = cu_seqlens.tolist(), slots.tolist()
    marks: dict[tuple[int, int], list[int]] = {}  # (b, n) -> snapshot rows
    for b, n, dst in ([] if snapshots is None else snapshots.tolist()):
        marks.setdefault((b, n), []).append(dst)
    for b, slot in enumerate(rows):
        start, end = bounds[b], bounds[b + 1]
        s = states[slot].clone()  # [Hv, Dk, Dv]
        for t in range(start, end):
            s = s * torch.exp(decay[t])[:, None, None]
            k_t = kn[t][:, :, None]
            delta = (vf[t] - tree_sum(s * k_t)) * bf[t][:, None]
            s = s + k_t * delta[:, None, :]
            out[t] = tree_sum(s * qn[t][:, :, None])
            for dst in marks.get((b, t - start + 1), ()):
                states[dst] = s
        states[slot] = s
    return out.to(v.dtype)


def heads_contiguous(x: torch.Tensor) -> torch.Tensor:
    """float32 [T, H, D] with each row's heads contiguous (a view of a wider row stays one)."""
    x = x.float()
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum over dim 1 of [H, D, E] as a pairwise tree fixed by D alone: exact adds of
    halves (an odd row carried), so no reduction kernel picks the order."""
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        summed = x[:, :half] + x[:, half:2 * half]
        x = torch.cat((summed, x[:, 2 * half:]), 1) if x.shape[1] % 2 else summed
    return x[:, 0]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim of [T, H, D], per row in a fixed order."""
    squares = (x * x).transpose(1, 2)  # [T, D, H]: tree_sum's layout
    return x / torch.sqrt(tree_sum(squares) + L2NORM_EPS)[:, :, None]


# -- which path, and the checks ---------------------------------------------------------------

def use_native(x: torch.Tensor, pool: torch.Tensor) -> bool:
    return x.is_cpu and pool.is_cpu and pool.dtype == torch.float32 and _native_loaded()


@cache
def _native_loaded() -> bool:
    info = native.describe()
    if native.load() is not None:
        logger.info("recurrent-layer ops: native kernels (%s)", info.level)
        return True
    on_purpose = info.reason.startswith("RADIXSERVE_NATIVE_KERNELS=0")
    (logger.info if on_purpose else logger.warning)(
        "recurrent-layer ops: the torch reference runs (a Python loop per token; the native "
        "kernels: %s)", info.reason)
    return False


def _check_activation(activation: str | None) -> None:
    if activation not in ("silu", None):
        raise ValueError(f"causal_conv: activation must be 'silu' or None, got {activation!r}")


def _check_conv(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                cu_seqlens: torch.Tensor, slots: torch.Tensor, snapshots: torch.Tensor | None,
                bias: torch.Tensor | None, activation: str | None) -> None:
    check_packed("causal_conv", cu_seqlens, slots, snapshots)
    _check_activation(activation)
    if x.dim() != 2 or weight.dim() != 2 or conv_states.dim() != 3:
        raise ValueError(f"causal_conv: x [T, C], weight [C, K], conv_states [S, K-1, C] "
                         f"expected, got {tuple(x.shape)}, {tuple(weight.shape)}, "
                         f"{tuple(conv_states.shape)}")
    width, num_taps = weight.shape
    if x.shape[1] != width or num_taps < 1 or tuple(conv_states.shape[1:]) != (num_taps - 1,
                                                                              width):
        raise ValueError(f"causal_conv: x {tuple(x.shape)}, weight {tuple(weight.shape)} and "
                         f"conv_states {tuple(conv_states.shape)} disagree")
    if bias is not None and tuple(bias.shape) != (width,):
        raise ValueError(f"causal_conv: bias must be [{width}], got {tuple(bias.shape)}")


def _check_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, states: torch.Tensor, cu_seqlens: torch.Tensor,
                 slots: torch.Tensor, snapshots: torch.Tensor | None) -> None:
    check_packed("gated_delta_rule", cu_seqlens, slots, snapshots)
    shapes = ", ".join(str(tuple(t.shape)) for t in (q, k, v, g, beta, states))
    if q.dim() != 3 or v.dim() != 3 or states.dim() != 4:
        raise ValueError(f"gated_delta_rule: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv], "
                         f"states [S, Hv, Dk, Dv] expected, got {shapes}")
    (num_rows, k_heads, k_dim), v_heads, v_dim = q.shape, v.shape[1], v.shape[2]
    if (k.shape != q.shape or v.shape[0] != num_rows or k_heads == 0 or v_heads % k_heads
            or g.shape != (num_rows, v_heads) or beta.shape != g.shape
            or states.shape[1:] != (v_heads, k_dim, v_dim)):
        raise ValueError(f"gated_delta_rule: q, k, v, g, beta, states disagree: {shapes} (Hv "
                         "a multiple of Hk)")
    if states.dtype != torch.float32:
        raise ValueError(f"gated_delta_rule: states must be float32, got {states.dtype}")


def check_packed(op: str, cu_seqlens: torch.Tensor, slots: torch.Tensor,
                  snapshots: torch.Tensor | None) -> None:
    for name, t, dim in (("cu_seqlens", cu_seqlens, 1), ("slots", slots, 1),
                         ("snapshots", snapshots, 2)):
        if t is not None and (t.dtype != torch.int64 or t.dim() != dim):
            raise ValueError(f"{op}: {name} must be int64 with {dim} dimension(s), got "
                             f"{t.dtype} {tuple(t.shape)}")
    if cu_seqlens.shape[0] != slots.shape[0] + 1:
        raise ValueError(f"{op}: cu_seqlens has {cu_seqlens.shape[0]} entries for "
                         f"{slots.shape[0]} slots (expected one more)")
    if snapshots is not None and snapshots.shape[1] != 3:
        raise ValueError(f"{op}: snapshots must be [N, 3] rows (b, n, dst), got "
                         f"{tuple(snapshots.shape)}")


def check_indices(op: str, num_rows: int, pool_rows: int, cu_seqlens: torch.Tensor,
                   slots: torch.Tensor, snapshots: torch.Tensor | None) -> None:
    """The contents of the packed layout (the native kernels check them themselves)."""
    lens = cu_seqlens.diff()
    if cu_seqlens[0] != 0 or cu_seqlens[-1] != num_rows or bool((lens < 0).any()):
        raise ValueError(f"{op}: cu_seqlens must rise from 0 to {num_rows}")
    if len(slots) and not (0 <= int(slots.min()) and int(slots.max()) < pool_rows):
        raise ValueError(f"{op}: slots must index the pool's {pool_rows} rows")
    if snapshots is None or not len(snapshots):
        return
    b, n, dst = snapshots.unbind(1)
    if not (bool((b >= 0).all()) and bool((b < len(slots)).all())
            and bool((n >= 1).all()) and bool((n <= lens[b.clamp(0, len(slots) - 1)]).all())
            and bool((dst >= 0).all()) and bool((dst < pool_rows).all())
            and not bool(torch.isin(dst, slots).any())):
        raise ValueError(f"{op}: a snapshot (b, n, dst) needs 0 <= b < {len(slots)}, "
                         "1 <= n <= sequence b's length, dst a pool row not in slots")
