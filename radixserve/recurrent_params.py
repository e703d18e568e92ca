"""The recurrent token mixers of a hybrid decoder, as the engine sees them: which layers hold a
per-sequence state instead of KV, and the shape of that state (runner/recurrent_state.py keeps
one row per state-pool slot).

Every hybrid layout names each layer's mixer with ``layer_types[i]``:

- ``LINEAR`` ("linear_attention"): a recurrent layer (Gated DeltaNet, Mamba2 or a short conv,
  by the layout's class), with a causal conv window ``conv_state_shape`` and, except for the
  short conv, a float32 state ``ssm_state_shape``;
- ``FULL`` ("full_attention"): attention over the KV pool;
- ``MLP_ONLY`` ("mlp"): no token mixer at all (Nemotron-H's MLP and MoE layers): no KV, no state.

Families map their own names ("mamba", "conv", "attention", the pattern "M-*E") to these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LINEAR, FULL, MLP_ONLY = "linear_attention", "full_attention", "mlp"


@dataclass(frozen=True)
class RecurrentLayout:
    """What every recurrent layout shares: the layer types (see the module docstring)."""

    layer_types: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = set(self.layer_types) - {LINEAR, FULL, MLP_ONLY}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}; known: "
                             f"{[LINEAR, FULL, MLP_ONLY]}")

    def is_linear(self, layer_idx: int) -> bool:
        return self.layer_types[layer_idx] == LINEAR

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """One sequence's conv window in one layer: (kernel - 1, channels)."""
        raise NotImplementedError

    @property
    def ssm_state_shape(self) -> tuple[int, ...] | None:
        """One sequence's float32 recurrent state in one layer; None: the conv window alone."""
        raise NotImplementedError


@dataclass(frozen=True)
class LinearAttnParams(RecurrentLayout):
    """Gated DeltaNet layers (Qwen3.5 / 3.6, Qwen3-Next): per sequence a state of
    ``num_value_heads`` matrices ``key_head_dim x value_head_dim`` and a causal conv window of
    ``conv_kernel - 1`` inputs of ``conv_dim`` channels (q, k and v before the conv)."""

    num_key_heads: int = 0
    num_value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_key_heads < 1 or self.num_value_heads % self.num_key_heads:
            raise ValueError(f"value heads ({self.num_value_heads}) must be a multiple of key "
                             f"heads ({self.num_key_heads})")

    @property
    def conv_dim(self) -> int:
        return (2 * self.num_key_heads * self.key_head_dim
                + self.num_value_heads * self.value_head_dim)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return self.conv_kernel - 1, self.conv_dim

    @property
    def ssm_state_shape(self) -> tuple[int, ...]:
        return self.num_value_heads, self.key_head_dim, self.value_head_dim


@dataclass(frozen=True)
class Mamba2Params(RecurrentLayout):
    """Mamba2 (SSD) layers (Granite 4.0-H, Nemotron-H, Falcon-H1): ``num_heads`` heads of
    ``head_dim`` channels, each with a ``head_dim x state_size`` state; B and C shared by the
    heads of each of ``n_groups`` groups; the conv runs over x, B and C (``conv_dim``
    channels, a bias where ``conv_bias``); dt clamped to ``time_step_limit``; ``in_proj`` and
    ``out_proj`` with biases where ``proj_bias``; the gated output RMSNorm normalizes each
    group's ``inner_size // n_groups`` channels."""

    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    n_groups: int = 1
    conv_kernel: int = 4
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    conv_bias: bool = True
    proj_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_groups < 1 or self.num_heads % self.n_groups:
            raise ValueError(f"Mamba2 heads ({self.num_heads}) must be a multiple of its groups "
                             f"({self.n_groups})")

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner_size + 2 * self.n_groups * self.state_size

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return self.conv_kernel - 1, self.conv_dim

    @property
    def ssm_state_shape(self) -> tuple[int, ...]:
        return self.num_heads, self.head_dim, self.state_size


@dataclass(frozen=True)
class ShortConvParams(RecurrentLayout):
    """LFM2's gated short-conv layers: the state is the conv window alone, ``conv_kernel - 1``
    inputs of ``conv_dim`` channels (the hidden size)."""

    conv_dim: int = 0
    conv_kernel: int = 3

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return self.conv_kernel - 1, self.conv_dim

    @property
    def ssm_state_shape(self) -> None:
        return None
