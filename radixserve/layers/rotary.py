"""Rotary position embedding (HF "rotate half" layout), any variant of layers/rope_scaling.py,
on the first ``rotary_dim`` dimensions of each head (Phi-4-mini's ``partial_rotary_factor``;
the rest pass through).

The cos/sin tables hold one row per position of the engine's context, the attention factor of
yarn / longrope folded in; a position's row never changes once the context length is set (see
rope_scaling.py on dynamic NTK and longrope). Where the model's ``KernelPlan`` says so
(``native``: float32 q/k on CPU, full-head rotation, the kernels loaded), q and k are rotated in
place in one call (``kernels/layer_ops.cpp``), bit-identical to the torch ops.

A model with mRoPE (Qwen VL) turns an image row's frequencies by three positions at once; its
rows' cos/sin are composed per step into ``extra_rows`` spare rows after the context's
(`reserve_rows`, `write_rows`: runner/mrope_rows.py), and those rows' positions name them, so
every path that indexes the tables by position (the native layer included) applies it as is.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import ops
from radixserve.layers.rope_scaling import rope_frequencies, rope_window


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables [context_len, rotary_dim] indexed by position; applied to q
    and k of shape [T, heads, head_dim]. ``max_positions``: the config's
    ``max_position_embeddings`` (dynamic NTK and longrope read it); the tables cover the rope's
    window (``rope_window``) until ``set_context_len`` says the engine's."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict | None, rotary_dim: int | None = None) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim or head_dim
        self.max_positions, self.theta, self.scaling = max_positions, theta, scaling
        self.context_len = rope_window(max_positions, scaling)
        self.register_buffer("_cos", torch.empty(0), persistent=False)
        self.register_buffer("_sin", torch.empty(0), persistent=False)
        self.extra_rows = 0  # spare rows after the context's (`reserve_rows`)
        self.native = False  # set by the model's KernelPlan (models/native_stack.py)

    @property
    def is_partial(self) -> bool:
        return self.rotary_dim != self.head_dim

    @property
    def cos(self) -> torch.Tensor:
        """[context_len, rotary_dim] float32, computed on first use (a 128k-position window's
        tables are 0.5 GB and a second to make; the engine reads only its context's)."""
        if not self._cos.numel():
            self._compute_tables()
        return self._cos

    @property
    def sin(self) -> torch.Tensor:
        if not self._sin.numel():
            self._compute_tables()
        return self._sin

    def set_context_len(self, context_len: int) -> None:
        """Fix the tables for an engine whose sequences reach ``context_len`` tokens (the
        positions 0 .. context_len - 1); call before the first forward."""
        self.context_len = context_len
        self.reset_tables()

    def reserve_rows(self, num_rows: int) -> None:
        """Keep ``num_rows`` spare rows after the context's (`write_rows`); call before the
        first forward (the tables are made anew)."""
        self.extra_rows = num_rows
        self.reset_tables()

    def write_rows(self, cos: torch.Tensor, sin: torch.Tensor) -> int:
        """Put ``cos`` and ``sin`` ([n, rotary_dim] float32, n <= ``extra_rows``) in the spare
        rows; the first one's index (a position naming it) is returned."""
        n, first = cos.shape[0], self.context_len
        assert n <= self.extra_rows, "more composed rows than were reserved"
        self.cos[first:first + n] = cos
        self.sin[first:first + n] = sin
        return first

    def check_positions(self, positions: torch.Tensor) -> None:
        """ValueError for a position past the tables (the native kernels would read past
        them); the model checks each step's positions once, before its layers."""
        last = int(positions.max()) if positions.numel() else -1
        if last >= self.context_len + self.extra_rows:
            raise ValueError(f"position {last} is past the rope tables' context "
                             f"({self.context_len} positions)")

    def reset_tables(self, device: torch.device | None = None) -> None:
        """Drop the tables (on ``device`` from now on, e.g. after the model was built on the
        meta device); the next use computes them for the current context length."""
        device = device or self._cos.device
        self._cos, self._sin = torch.empty(0, device=device), torch.empty(0, device=device)

    def _compute_tables(self) -> None:
        inv_freq, attention = rope_frequencies(self.rotary_dim, self.theta, self.scaling,
                                               self.max_positions, self.context_len)
        t = torch.arange(self.context_len, dtype=torch.float32)
        emb = torch.outer(t, inv_freq.float()).repeat(1, 2)
        cos, sin = emb.cos(), emb.sin()
        if attention != 1.0:  # yarn / longrope: transformers scales cos and sin in float32
            cos, sin = cos * attention, sin * attention
        if self.extra_rows:
            spare = torch.zeros(self.extra_rows, cos.shape[1])
            cos, sin = torch.cat((cos, spare)), torch.cat((sin, spare))
        self._cos, self._sin = cos.to(self._cos.device), sin.to(self._sin.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, d], k [T, KVH, d] → rotated (q, k); the native path rotates them in place
        and returns the same tensors."""
        if self.native:
            ops.rotary_(q, k, positions, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        if self.is_partial:
            r = self.rotary_dim
            return (torch.cat((_apply(q[..., :r], cos, sin), q[..., r:]), dim=-1),
                    torch.cat((_apply(k[..., :r], cos, sin), k[..., r:]), dim=-1))
        return _apply(q, cos, sin), _apply(k, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

