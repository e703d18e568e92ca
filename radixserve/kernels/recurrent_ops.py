"""The boundary between tensors and the recurrent-layer kernels: the causal conv and the gated
delta rule of a Gated DeltaNet layer (delta_rule.cpp), the Mamba2 scan and its gated output
norm (ssd_scan.cpp), over a packed batch and a state pool (the contracts:
layers/gated_deltanet.py and layers/mamba2.py, which call these).

As ``ops.py`` (the boundary of every other kernel; this one sits beside it to keep both files
small): each argument's dtype, shape, layout and device checked with O(1) attribute reads,
raising a TypeError (dtype) or ValueError (the rest) that names the kernel and the argument;
the index contents (cu_seqlens, slots, snapshots) are checked by the kernel, a nonzero return
raised here as a ValueError.
"""

from __future__ import annotations

import torch

from radixserve.kernels import native

_F32, _I64 = torch.float32, torch.int64

# the recurrent kernels' return codes (packed_layout.h)
_ERRORS = {1: "cu_seqlens must rise from 0 to the number of rows",
           2: "slots must index the pool's rows",
           3: "a snapshot (b, n, dst) needs b a sequence, 1 <= n <= its length and dst a pool "
              "row not in slots"}


def _lib():
    lib = native.load()
    if lib is None:
        raise RuntimeError("the native CPU kernels are not loaded (radixserve env says why)")
    return lib


def _check(kernel: str, name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple,
           layout: str = "contiguous") -> None:
    """``t`` is a CPU tensor of ``dtype`` and ``shape`` (None: any size there), laid out as
    ``layout`` says: "contiguous", "rows" (2-D, each row contiguous) or "heads" ([T, heads,
    d], each row's heads contiguous, a row stride of its own)."""
    if t.dtype != dtype:
        raise TypeError(f"{kernel}: {name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(w is not None and w != s for w, s in zip(shape, t.shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{kernel}: {name} must have shape ({want}), got {tuple(t.shape)}")
    if not t.is_cpu:
        raise ValueError(f"{kernel}: {name} must be on the CPU, got {t.device}")
    if layout == "contiguous" and not t.is_contiguous():
        raise ValueError(f"{kernel}: {name} must be contiguous")
    if layout == "rows" and t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{kernel}: {name} must have each row contiguous")
    if layout == "heads" and not (t.stride(2) == 1 and t.stride(1) == t.shape[2]):
        raise ValueError(f"{kernel}: {name} must have each row's heads contiguous, got "
                         f"strides {t.stride()}")


def _packed(kernel: str, cu_seqlens: torch.Tensor, slots: torch.Tensor,
            snapshots: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The checked snapshots (an empty [0, 3] for None) and their count."""
    _check(kernel, "slots", slots, _I64, (None,))
    _check(kernel, "cu_seqlens", cu_seqlens, _I64, (slots.shape[0] + 1,))
    if snapshots is None:
        snapshots = torch.empty(0, 3, dtype=_I64)
    _check(kernel, "snapshots", snapshots, _I64, (None, 3))
    return snapshots, snapshots.shape[0]


def _raise_on(kernel: str, code: int) -> None:
    if code:
        raise ValueError(f"{kernel}: {_ERRORS.get(code, f'failed ({code})')}")


def causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_states: torch.Tensor,
                cu_seqlens: torch.Tensor, slots: torch.Tensor, snapshots: torch.Tensor | None,
                bias: torch.Tensor | None = None, is_silu: bool = True) -> torch.Tensor:
    """The causal depthwise conv of float32 x [T, C] with weight [C, K], plus bias [C] where
    given, then silu where ``is_silu``; windows in conv_states [S, K-1, C] (updated in place,
    snapshots written): out [T, C] float32 (rs_causal_conv)."""
    kernel = "rs_causal_conv"
    rows, width = x.shape if x.dim() == 2 else (0, 0)
    _check(kernel, "x", x, _F32, (None, None))
    _check(kernel, "weight", weight, _F32, (width, None))
    if bias is not None:
        _check(kernel, "bias", bias, _F32, (width,))
    taps = weight.shape[1]
    _check(kernel, "conv_states", conv_states, _F32, (None, taps - 1, width))
    snapshots, num_snapshots = _packed(kernel, cu_seqlens, slots, snapshots)
    out = torch.empty(rows, width)
    _raise_on(kernel, _lib().rs_causal_conv(
        x.data_ptr(), rows, width, weight.data_ptr(), taps,
        None if bias is None else bias.data_ptr(), int(is_silu), conv_states.data_ptr(),
        conv_states.shape[0], cu_seqlens.data_ptr(), slots.data_ptr(), slots.shape[0],
        snapshots.data_ptr(), num_snapshots, out.data_ptr()))
    return out


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, states: torch.Tensor, cu_seqlens: torch.Tensor,
                     slots: torch.Tensor, snapshots: torch.Tensor | None) -> torch.Tensor:
    """The gated delta rule on float32 q, k [T, Hk, Dk], v [T, Hv, Dv] (each row's heads
    contiguous), g, beta [T, Hv] and the pool states [S, Hv, Dk, Dv] (updated in place,
    snapshots written): out [T, Hv, Dv] float32 (rs_gated_delta_rule)."""
    kernel = "rs_gated_delta_rule"
    _check(kernel, "q", q, _F32, (None, None, None), "heads")
    rows, k_heads, k_dim = q.shape
    _check(kernel, "k", k, _F32, (rows, k_heads, k_dim), "heads")
    _check(kernel, "v", v, _F32, (rows, None, None), "heads")
    v_heads, v_dim = v.shape[1:]
    if k_heads == 0 or v_heads % k_heads:
        raise ValueError(f"{kernel}: v's {v_heads} heads are not a multiple of k's {k_heads}")
    _check(kernel, "g", g, _F32, (rows, v_heads))
    _check(kernel, "beta", beta, _F32, (rows, v_heads))
    _check(kernel, "states", states, _F32, (None, v_heads, k_dim, v_dim))
    snapshots, num_snapshots = _packed(kernel, cu_seqlens, slots, snapshots)
    out = torch.empty(rows, v_heads, v_dim)
    _raise_on(kernel, _lib().rs_gated_delta_rule(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
        g.data_ptr(), beta.data_ptr(), rows, k_heads, v_heads, k_dim, v_dim, states.data_ptr(),
        states.shape[0], cu_seqlens.data_ptr(), slots.data_ptr(), slots.shape[0],
        snapshots.data_ptr(), num_snapshots, out.data_ptr()))
    return out


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) [T, H] float32 of a Gated DeltaNet: g = -exp(A_log) * softplus(a +
    dt_bias), beta = sigmoid(b), from float32 a, b [T, H] (rows of any stride) and the
    layer's A_log, dt_bias [H] (rs_gdn_gates: scalar, so batch invariant)."""
    kernel = "rs_gdn_gates"
    rows, heads = a.shape
    for name, t, shape in (("a", a, (rows, heads)), ("b", b, (rows, heads))):
        _check(kernel, name, t, _F32, shape, "rows")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check(kernel, name, t, _F32, (heads,))
    g, beta = torch.empty(rows, heads), torch.empty(rows, heads)
    _lib().rs_gdn_gates(a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0),
                        A_log.data_ptr(), dt_bias.data_ptr(), rows, heads, g.data_ptr(),
                        beta.data_ptr())
    return g, beta


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) for float32 x [T, W] (contiguous) and gate [T, W] (rows of any
    stride) (rs_sigmoid_mul: scalar, so batch invariant)."""
    kernel = "rs_sigmoid_mul"
    _check(kernel, "x", x, _F32, (None, None))
    _check(kernel, "gate", gate, _F32, tuple(x.shape), "rows")
    out = torch.empty_like(x)
    _lib().rs_sigmoid_mul(x.data_ptr(), gate.data_ptr(), gate.stride(0), x.shape[0],
                          x.shape[1], out.data_ptr())
    return out


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
             time_step_limit: tuple[float, float], states: torch.Tensor,
             cu_seqlens: torch.Tensor, slots: torch.Tensor,
             snapshots: torch.Tensor | None) -> torch.Tensor:
    """The Mamba2 scan on float32 x [T, H, P], B, C [T, G, N] (each row's heads / groups
    contiguous), dt [T, H] (rows of any stride; raw, before dt_bias and softplus), A, D,
    dt_bias [H] and the pool states [S, H, P, N] (updated in place, snapshots written): y
    [T, H, P] float32 (rs_ssd_scan, in ssd_scan.cpp)."""
    kernel = "rs_ssd_scan"
    _check(kernel, "x", x, _F32, (None, None, None), "heads")
    rows, heads, head_dim = x.shape
    _check(kernel, "B", B, _F32, (rows, None, None), "heads")
    groups, state_size = B.shape[1:]
    if groups == 0 or heads % groups:
        raise ValueError(f"{kernel}: x's {heads} heads are not a multiple of B's {groups} "
                         "groups")
    _check(kernel, "C", C, _F32, (rows, groups, state_size), "heads")
    _check(kernel, "dt", dt, _F32, (rows, heads), "rows")
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        _check(kernel, name, t, _F32, (heads,))
    _check(kernel, "states", states, _F32, (None, heads, head_dim, state_size))
    snapshots, num_snapshots = _packed(kernel, cu_seqlens, slots, snapshots)
    out = torch.empty(rows, heads, head_dim)
    _raise_on(kernel, _lib().rs_ssd_scan(
        x.data_ptr(), x.stride(0), dt.data_ptr(), dt.stride(0), A.data_ptr(), B.data_ptr(),
        B.stride(0), C.data_ptr(), C.stride(0), D.data_ptr(), dt_bias.data_ptr(),
        float(time_step_limit[0]), float(time_step_limit[1]), rows, heads, head_dim, groups,
        state_size, states.data_ptr(), states.shape[0], cu_seqlens.data_ptr(),
        slots.data_ptr(), slots.shape[0], snapshots.data_ptr(), num_snapshots, out.data_ptr()))
    return out


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int,
                   eps: float) -> torch.Tensor:
    """weight * rms_norm(y * silu(z)) over each ``group_size`` channels of a row, for float32
    y [T, W] (contiguous), z [T, W] (rows of any stride), weight [W] (rs_gated_rms_norm: a
    row's result never depends on the batch)."""
    kernel = "rs_gated_rms_norm"
    _check(kernel, "y", y, _F32, (None, None))
    rows, width = y.shape
    _check(kernel, "z", z, _F32, (rows, width), "rows")
    _check(kernel, "weight", weight, _F32, (width,))
    if group_size < 1 or width % group_size:
        raise ValueError(f"{kernel}: {width} channels are not groups of {group_size}")
    out = torch.empty_like(y)
    _lib().rs_gated_rms_norm(y.data_ptr(), z.data_ptr(), z.stride(0), weight.data_ptr(), rows,
                             width, group_size, eps, out.data_ptr())
    return out
