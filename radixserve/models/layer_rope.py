"""Per-layer rope for models whose layers do not all share one (``ModelConfig.layer_rope``):
SmolLM3's NoPE layers (no rotation at all) and OLMo 3's sliding-window layers (a plain rope
beside the full layers' scaled one).

A NoPE layer gets ``NoRope``: its forward returns q and k untouched, and its tables are cos 1,
sin 0, so the native layer call (decoder_layer.cpp, which always rotates) leaves them as they
are to the bit (``a * 1 + (-b) * 0 == a``): such a model keeps one native call per layer.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig


class NoRope(RotaryEmbedding):
    """A rotary that rotates by nothing (see the module docstring)."""

    def __init__(self, head_dim: int, max_positions: int) -> None:
        super().__init__(head_dim, max_positions, 10000.0, None)

    def _compute_tables(self) -> None:
        shape = (self.context_len, self.rotary_dim)
        self._cos = torch.ones(shape, device=self._cos.device)
        self._sin = torch.zeros(shape, device=self._sin.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class LayerRotaries(nn.Module):
    """A model's distinct rope tables, reset, sized and checked together: ``model.rotary``,
    which the loaders and the engine call (``reset_tables``, ``set_context_len``,
    ``check_positions``: see layers/rotary.py)."""

    def __init__(self, rotaries: list[RotaryEmbedding]) -> None:
        super().__init__()
        self.tables = nn.ModuleList(rotaries)

    def reset_tables(self, device: torch.device | None = None) -> None:
        for rotary in self.tables:
            rotary.reset_tables(device)

    def set_context_len(self, context_len: int) -> None:
        for rotary in self.tables:
            rotary.set_context_len(context_len)

    def check_positions(self, positions: torch.Tensor) -> None:
        """ValueError for a position past the shortest table."""
        min(self.tables, key=lambda r: r.context_len).check_positions(positions)


def layer_rotaries(cfg: ModelConfig) -> tuple[LayerRotaries, list[RotaryEmbedding]]:
    """(the model's ``rotary``, each layer's) for ``cfg``: ``NoRope`` on the layers of
    ``layer_rope.no_rope``; a plain rope of base ``layer_rope.sliding_theta`` on the windowed
    layers where one is given; the model's rope (``rope_theta``, ``rope_scaling``,
    ``rotary_dim``) on the rest."""
    lr = cfg.layer_rope
    full = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                           cfg.rope_scaling, cfg.rotary_dim)
    sliding = none = None
    if lr is not None and lr.sliding_theta is not None:
        sliding = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, lr.sliding_theta,
                                  None, cfg.rotary_dim)
    if lr is not None and lr.no_rope:
        none = NoRope(cfg.head_dim, cfg.max_position_embeddings)
    for rotary in (sliding, none):  # tables as long as the full layers' (a yarn window)
        if rotary is not None:
            rotary.context_len = full.context_len
    per_layer = []
    for i in range(cfg.num_layers):
        if none is not None and i in lr.no_rope:
            per_layer.append(none)
        elif sliding is not None and cfg.layer_window(i) is not None:
            per_layer.append(sliding)
        else:
            per_layer.append(full)
    used = list({id(r): r for r in per_layer}.values()) or [full]
    return LayerRotaries(used), per_layer
