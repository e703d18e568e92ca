"""Gemma 4's routed experts (26B-A4B): beside each layer's dense MLP, on the same residual
stream (models/gemma4.py's layer):

    dense  = post_ffw_norm_1(mlp(pre_ffw_norm(h)))
    routed = post_ffw_norm_2(experts(pre_ffw_norm_2(h)))      weights from router(h)
    h      = h + post_ffw_norm(dense + routed)

The router: h RMS-normed without a weight, times ``scale`` and hidden ** -0.5, a linear to
one logit per expert, softmax (float32), the top k renormalized to sum 1, each times its
expert's ``per_expert_scale``. An expert: ``down(gelu_tanh(gate(x)) * up(x))``, one module
with nn.Linear ``gate_up_proj`` [2I, H] (gate rows, then up rows) and ``down_proj`` [H, I],
so a GGUF file loaded as stored holds each as its stored blocks (models/gguf_stored.py).
Checkpoints stack them per layer: transformers' ``experts.gate_up_proj`` [E, 2I, H] and
``experts.down_proj`` [E, H, I] (``unfuse_experts`` cuts them), llama.cpp's
``ffn_gate_up_exps`` / ``ffn_down_exps`` (models/gemma4_gguf.py).

Experts run one at a time over the rows that picked them, in expert order; a row's result is
its experts' outputs, each times its weight, added in that order.

NOTE: batch invariance: the router's and the experts' linears give a row the same bits in any
batch where they are native (as stored); softmax, top-k and the GeGLU are per row, and a row's
sum runs over its own experts in expert order whatever else the step holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from radixserve.layers.activation import gelu_tanh_and_mul
from radixserve.layers.moe import Expert
from radixserve.layers.norm import RMSNorm
from radixserve.model_config import ModelConfig

_FUSED = (".experts.gate_up_proj", ".experts.down_proj")  # transformers' 3-D expert tensors


class Gemma4Router(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        g = cfg.gemma4
        self.eps, self.top_k, self.hidden = cfg.rms_norm_eps, g.top_k_experts, cfg.hidden_size
        self.proj = nn.Linear(cfg.hidden_size, g.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(g.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] → (weights [T, k] float32, expert ids [T, k])."""
        xf = x.float()
        normed = (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)).to(x.dtype)
        logits = self.proj(normed * self.scale * self.hidden ** -0.5)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids], ids


class GeluExpert(Expert):
    """One GeGLU expert: ``down(gelu_tanh(gate(x)) * up(x))``, gate and up fused in one
    linear (``native``: the GeGLU kernel, set by the model's KernelPlan)."""

    activation: ClassVar[str] = "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x), self.native))


class Gemma4Experts(nn.ModuleList):
    """A layer's ``num_experts`` GeluExperts (``experts.E.gate_up_proj`` and
    ``experts.E.down_proj``, E from 0)."""

    def __init__(self, cfg: ModelConfig) -> None:
        g = cfg.gemma4
        super().__init__(GeluExpert(cfg.hidden_size, g.moe_intermediate_size)
                         for _ in range(g.num_experts))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], the router's weights [T, k] and ids [T, k] → [T, H]."""
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():  # ascending
            rows, slot = torch.where(ids == expert)
            y = self[expert](x[rows])
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out


def gemma4_expert_parts(name: str, shape) -> list[tuple[str, tuple]] | None:
    """For a checkpoint's 3-D expert tensor (``...experts.gate_up_proj`` [E, 2I, H],
    ``...experts.down_proj`` [E, H, I]): (each expert's linear weight name, the index of its
    matrix in the tensor); None for any other tensor."""
    if not name.endswith(_FUSED) or len(shape) != 3:
        return None
    prefix, kind = name.rsplit(".", 1)
    return [(f"{prefix}.{e}.{kind}.weight", (e,)) for e in range(int(shape[0]))]


def unfuse_experts(weights: Iterable[tuple[str, torch.Tensor]]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint (name, tensor) pairs with each 3-D expert tensor cut into its experts'
    matrices (``gemma4_expert_parts``, views); the other tensors as they are."""
    for name, weight in weights:
        parts = gemma4_expert_parts(name, weight.shape)
        if parts is None:
            yield name, weight
        else:
            yield from ((part, weight[index]) for part, index in parts)


def attach_moe(layer: nn.Module, cfg: ModelConfig) -> None:
    """Give a decoder ``layer`` the router, the experts and the three norms they add (under
    transformers' names; the experts' per expert, see ``unfuse_experts``)."""
    hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
    layer.router = Gemma4Router(cfg)
    layer.experts = Gemma4Experts(cfg)
    layer.post_feedforward_layernorm_1 = RMSNorm(hidden, eps)
    layer.post_feedforward_layernorm_2 = RMSNorm(hidden, eps)
    layer.pre_feedforward_layernorm_2 = RMSNorm(hidden, eps)


def moe_ffn(layer: nn.Module, h: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """The dense MLP's output ``dense`` and the experts' over the stream ``h``, each normed,
    summed (the layer's post-feedforward norm comes after)."""
    weights, ids = layer.router(h)
    routed = layer.experts(layer.pre_feedforward_layernorm_2(h), weights, ids)
    return layer.post_feedforward_layernorm_1(dense) + layer.post_feedforward_layernorm_2(routed)
