"""Qwen3-Next (``Qwen3NextForCausalLM``, Qwen3-Next-80B-A3B; GGUF ``qwen3next``): Qwen3.5's
predecessor and the same decoder (models/qwen35.py: Gated DeltaNet and gated attention layers,
3:1, (1 + w) norms, a sparse MoE block with a gated shared expert in the layers
``ModelConfig.moe`` makes sparse), but for how its Gated DeltaNet projects its input.

transformers' ``Qwen3NextGatedDeltaNet`` holds two fused projections whose rows are grouped by
key head: ``in_proj_qkvz`` gives per key head h ``[q_h | k_h | v_h | z_h]`` (its ``r`` value
heads' v and z, r = value heads / key heads), ``in_proj_ba`` gives ``[b_h | a_h]`` (r each).
Here the layer holds them fused too, with their rows put in one block per part at load
(``hf_row_order``: the float loader and the 16-bit one, models/half_stored.py, apply it):
``in_proj_qkvz`` rows ``[q | k | v | z]``, the ``[q | k | v]`` part being Qwen3.5's
``in_proj_qkv`` (what the conv takes), and ``in_proj_ba`` rows ``[b | a]``. That is also a
GGUF file's layout: llama.cpp's converter
writes ``attn_qkv`` and ``attn_gate`` (the two parts, loaded as the packed shards
``in_proj_qkv`` and ``in_proj_z``), and files from before it did write the fused ``ssm_in``
as transformers holds it; ``ssm_ba`` is always transformers' (models/qwen3next_gguf.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from radixserve.model_config import ModelConfig
from radixserve.models.qwen35 import GatedDeltaNet, Qwen35ForCausalLM
from radixserve.recurrent_params import LinearAttnParams


def _rows(t: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    return t if order is None else t[order.to(t.device)]


def grouped_row_order(num_groups: int, sizes: tuple[int, ...]) -> torch.Tensor:
    """The index that takes rows laid out per group ``[part_0 | part_1 | ...]`` (part i
    ``sizes[i]`` rows) to one block per part, each in group order: ``blocks = rows[order]``."""
    rows = torch.arange(num_groups * sum(sizes)).view(num_groups, sum(sizes))
    return torch.cat([part.reshape(-1) for part in rows.split(sizes, dim=1)])


def qkvz_row_order(la: LinearAttnParams) -> torch.Tensor:
    """transformers' ``in_proj_qkvz`` rows → ``[q | k | v | z]`` (``ours = hf[order]``)."""
    per_key_head = la.num_value_heads // la.num_key_heads * la.value_head_dim
    return grouped_row_order(la.num_key_heads, (la.key_head_dim, la.key_head_dim,
                                                per_key_head, per_key_head))


def ba_row_order(la: LinearAttnParams) -> torch.Tensor:
    """transformers' ``in_proj_ba`` rows → ``[b | a]`` (``ours = hf[order]``)."""
    per_key_head = la.num_value_heads // la.num_key_heads
    return grouped_row_order(la.num_key_heads, (per_key_head, per_key_head))


class Qwen3NextGatedDeltaNet(GatedDeltaNet):
    """Qwen3.5's ``GatedDeltaNet`` whose input projections are two fused matrices,
    ``in_proj_qkvz`` (rows ``[q | k | v | z]``) and ``in_proj_ba`` (rows ``[b | a]``)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        la = cfg.linear_attn
        value_dim = la.num_value_heads * la.value_head_dim
        # Qwen3.5's four projections, replaced by the two fused ones (built on the meta device
        # at load, so nothing is allocated for them)
        del self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, la.conv_dim + value_dim, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * la.num_value_heads, bias=False)
        self.qkvz_split = (la.conv_dim, value_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        qkv, z = self.in_proj_qkvz(x).split(self.qkvz_split, dim=-1)
        b, a = self.in_proj_ba(x).chunk(2, dim=-1)
        return qkv, z, a, b


class Qwen3NextForCausalLM(Qwen35ForCausalLM):
    """Qwen3-Next's text decoder; weights use transformers' names and layouts (the fused
    DeltaNet projections' rows reordered at load, see the module docstring), or Qwen3.5's
    ``in_proj_qkv`` / ``in_proj_z`` as the two parts of ``in_proj_qkvz`` (a GGUF file's)."""

    packed_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        **Qwen35ForCausalLM.packed_modules, "in_proj_qkvz": ("in_proj_qkv", "in_proj_z")}
    linear_attn_cls: ClassVar[type[GatedDeltaNet]] = Qwen3NextGatedDeltaNet

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Transformers-named tensors (``in_proj_qkvz`` / ``in_proj_ba`` in transformers' row
        order). ValueError on a missing or unexpected tensor."""
        super().load_weights((name, _rows(tensor, self.hf_row_order(name)))
                             for name, tensor in weights)

    def hf_row_order(self, name: str) -> torch.Tensor | None:
        """The index that takes the rows of the checkpoint's matrix ``name`` (transformers'
        name) to this model's (``ours = theirs[order]``); None where they are the same. The
        16-bit loader (models/half_stored.py) reads it too."""
        la = self.config.linear_attn
        if name.endswith("linear_attn.in_proj_qkvz.weight"):
            return qkvz_row_order(la)
        if name.endswith("linear_attn.in_proj_ba.weight"):
            return ba_row_order(la)
        return None

    def _shard_range(self, target: str, idx: int, rows: int) -> tuple[int, int]:
        if target != "in_proj_qkvz":
            return super()._shard_range(target, idx, rows)
        conv_dim = self.config.linear_attn.conv_dim
        return (0, conv_dim) if idx == 0 else (conv_dim, rows - conv_dim)

    def _expected_names(self) -> list[str]:
        names = []
        for name in super()._expected_names():  # in_proj_qkvz: whole or as its two parts
            names += [f"{name}#0", f"{name}#1"] if ".in_proj_qkvz." in name else [name]
        return names
