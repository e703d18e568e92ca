"""The Mamba2 (SSD) token mixer of hybrid decoders (Granite 4.0-H, Nemotron-H), over a packed
batch of sequences, each with its state in a row of a pool:

* ``mamba2_scan``: the selective scan, per token and head h (group g = h // (H / G))::

      dt = clamp(softplus(dt + dt_bias), *time_step_limit)
      S  = S * exp(dt * A) + dt * x ⊗ B[g]        S: the head's [P, N] float32 state
      y  = S @ C[g] + D * x

  what transformers' chunked (SSD) ``torch_forward`` computes, in the recurrent form.
* ``Mamba2Mixer``: the layer (transformers' ``GraniteMoeHybridMambaLayer`` /
  ``NemotronHMamba2Mixer`` with their parameter names): ``in_proj`` -> [z | xBC | dt], the
  causal conv (bias, SiLU) over xBC, the scan, the gated group RMSNorm
  ``norm(y * silu(z))``, ``out_proj``.

The packed layout, the snapshots and the engine's batch-invariance rule are those of
layers/gated_deltanet.py (read its docstring): the torch reference walks each sequence token by
token on fixed-shape tensors ([H] steps, [H, P, N] states), sums over N as a fixed pairwise tree;
the native kernels (kernels/ssd_scan.cpp) keep the rule in their own float order and match the
reference to rounding. Which path runs: as there, per call.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from radixserve.kernels import recurrent_ops
from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.gated_deltanet import (
    causal_conv,
    check_indices,
    check_packed,
    heads_contiguous,
    tree_sum,
    use_native,
)
from radixserve.layers.norm import RMSNorm
from radixserve.model_config import ModelConfig
from radixserve.recurrent_params import Mamba2Params

NO_LIMIT = (0.0, math.inf)


def mamba2_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor,
                cu_seqlens: torch.Tensor, slots: torch.Tensor,
                snapshots: torch.Tensor | None = None,
                time_step_limit: tuple[float, float] = NO_LIMIT) -> torch.Tensor:
    """The Mamba2 scan (module docstring): x [T, H, P], dt [T, H] (raw: before dt_bias and
    softplus), A [H] (= -exp(A_log)), B, C [T, G, N] (H a multiple of G), D, dt_bias [H];
    ``states`` [S, H, P, N] float32, row ``slots[b]`` sequence b's state, updated IN PLACE
    (snapshots written as layers/gated_deltanet.py says). Returns y [T, H, P] in x's dtype.
    ValueError for inconsistent shapes or indices."""
    _check_scan(x, dt, A, B, C, D, dt_bias, states, cu_seqlens, slots, snapshots)
    if use_native(x, states):
        out = recurrent_ops.ssd_scan(
            heads_contiguous(x), dt.float(), A.float().contiguous(), heads_contiguous(B),
            heads_contiguous(C),
            D.float().contiguous(), dt_bias.float().contiguous(), time_step_limit, states,
            cu_seqlens, slots, snapshots)
        return out.to(x.dtype)
    return mamba2_scan_reference(x, dt, A, B, C, D, dt_bias, states, cu_seqlens, slots,
                                 snapshots, time_step_limit)


def mamba2_scan_reference(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                          B: torch.Tensor, C: torch.Tensor, D: torch.Tensor,
                          dt_bias: torch.Tensor, states: torch.Tensor,
                          cu_seqlens: torch.Tensor, slots: torch.Tensor,
                          snapshots: torch.Tensor | None = None,
                          time_step_limit: tuple[float, float] = NO_LIMIT) -> torch.Tensor:
    """``mamba2_scan`` in torch (any device): a Python loop per sequence and token."""
    check_indices("mamba2_scan", x.shape[0], states.shape[0], cu_seqlens, slots, snapshots)
    group = x.shape[1] // B.shape[1]
    xf, raw = x.float(), dt.float()
    bh = B.float().repeat_interleave(group, 1)  # [T, H, N]: each head's group
    ch = C.float().repeat_interleave(group, 1)
    a, d, bias = A.float(), D.float(), dt_bias.float()
    out = torch.empty(x.shape, device=x.device)
    bounds, rows = cu_seqlens.tolist(), slots.tolist()
    marks: dict[tuple[int, int], list[int]] = {}  # (b, n) -> snapshot rows
    for b, n, dst in ([] if snapshots is None else snapshots.tolist()):
        marks.setdefault((b, n), []).append(dst)
    for b, slot in enumerate(rows):
        start, end = bounds[b], bounds[b + 1]
        s = states[slot].clone()  # [H, P, N]
        for t in range(start, end):
            step = F.softplus(raw[t] + bias).clamp(*time_step_limit)  # [H]
            s = (s * torch.exp(step * a)[:, None, None]
                 + (step[:, None] * xf[t])[:, :, None] * bh[t][:, None, :])
            out[t] = tree_sum((s * ch[t][:, None, :]).transpose(1, 2)) + d[:, None] * xf[t]
            for dst in marks.get((b, t - start + 1), ()):
                states[dst] = s
        states[slot] = s
    return out.to(x.dtype)


class GatedGroupRMSNorm(RMSNorm):
    """transformers' ``GraniteMoeHybridRMSNormGated`` / ``NemotronHRMSNormGated`` (the gate
    before the norm): ``weight * rms_norm(y * silu(z))`` over each ``group_size`` channels of a
    row, in float32. An RMSNorm, so the kernel plan sets ``native`` (then one batch-invariant
    kernel call)."""

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__(dim, eps)
        self.group_size = group_size

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """[T, dim] float32 from y, z [T, dim]."""
        if self.native:
            return recurrent_ops.gated_rms_norm(y.float().contiguous(), z.float(),
                                                self.weight.float(), self.group_size, self.eps)
        v = y.float() * F.silu(z.float())
        grouped = v.view(v.shape[0], -1, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * grouped.view(v.shape)


class Mamba2Mixer(nn.Module):
    """transformers' Mamba2 mixer over a packed batch, its states in the forward context's
    slots (conv window ``states.conv[layer_idx]``, scan state ``states.ssm[layer_idx]``).
    ``cfg.linear_attn`` is a ``Mamba2Params``; parameters keep transformers' names."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        m = cfg.linear_attn
        if not isinstance(m, Mamba2Params):
            raise TypeError(f"Mamba2Mixer needs a Mamba2Params layout, got {type(m).__name__}")
        self.layer_idx, self.params = layer_idx, m
        inner, heads, group_dims = m.inner_size, m.num_heads, m.n_groups * m.state_size
        self.split = (inner, m.conv_dim, heads)  # in_proj's rows: [z | xBC | dt]
        self.xbc_split = (inner, group_dims, group_dims)
        self.in_proj = nn.Linear(cfg.hidden_size, inner + m.conv_dim + heads, bias=m.proj_bias)
        self.conv1d = nn.Module()  # transformers' names: conv1d.weight [conv_dim, 1, K], .bias
        self.conv1d.weight = nn.Parameter(torch.empty(m.conv_dim, 1, m.conv_kernel))
        self.conv1d.bias = nn.Parameter(torch.zeros(m.conv_dim)) if m.conv_bias else None
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = GatedGroupRMSNorm(inner, inner // m.n_groups, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(inner, cfg.hidden_size, bias=m.proj_bias)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; updates this layer's states (module docstring)."""
        m, n = self.params, x.shape[0]
        states = get_forward_context().states
        packed = (states.cu_seqlens, states.slots, states.snapshots)
        z, xbc, dt = self.in_proj(x).split(self.split, dim=-1)
        xbc = causal_conv(xbc, self.conv1d.weight[:, 0], states.conv[self.layer_idx], *packed,
                          bias=self.conv1d.bias, activation="silu")
        xs, B, C = xbc.float().split(self.xbc_split, dim=-1)
        y = mamba2_scan(xs.view(n, m.num_heads, m.head_dim), dt, -torch.exp(self.A_log.float()),
                        B.view(n, m.n_groups, m.state_size), C.view(n, m.n_groups, m.state_size),
                        self.D, self.dt_bias, states.ssm[self.layer_idx], *packed,
                        time_step_limit=m.time_step_limit)
        y = self.norm(y.view(n, -1), z)
        return self.out_proj(y.to(x.dtype))


def _check_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor,
                cu_seqlens: torch.Tensor, slots: torch.Tensor,
                snapshots: torch.Tensor | None) -> None:
    check_packed("mamba2_scan", cu_seqlens, slots, snapshots)
    shapes = ", ".join(str(tuple(t.shape)) for t in (x, dt, A, B, C, D, dt_bias, states))
    if x.dim() != 3 or B.dim() != 3 or states.dim() != 4:
        raise ValueError(f"mamba2_scan: x [T, H, P], dt [T, H], A [H], B, C [T, G, N], D, "
                         f"dt_bias [H], states [S, H, P, N] expected, got {shapes}")
    (num_rows, heads, head_dim), groups = x.shape, B.shape[1]
    if (groups == 0 or heads % groups or B.shape[0] != num_rows or C.shape != B.shape
            or dt.shape != (num_rows, heads)
            or any(t.shape != (heads,) for t in (A, D, dt_bias))
            or states.shape[1:] != (heads, head_dim, B.shape[2])):
        raise ValueError(f"mamba2_scan: x, dt, A, B, C, D, dt_bias, states disagree: {shapes} "
                         "(H a multiple of G)")
    if states.dtype != torch.float32:
        raise ValueError(f"mamba2_scan: states must be float32, got {states.dtype}")
