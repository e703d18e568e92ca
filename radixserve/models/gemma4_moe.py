"""Gemma 4's routed experts (26B-A4B): beside each layer's dense MLP, on the same residual
stream (models/gemma4.py's layer):

    dense  = post_ffw_norm_1(mlp(pre_ffw_norm(h)))
    routed = post_ffw_norm_2(experts(pre_ffw_norm_2(h)))      weights from router(h)
    h      = h + post_ffw_norm(dense + routed)

The router: h RMS-normed without a weight, times ``scale`` and hidden ** -0.5, a linear to
one logit per expert, softmax (float32), the top k renormalized to sum 1, each times its
expert's ``per_expert_scale``. An expert: ``down(gelu_tanh(gate(x)) * up(x))`` with gate and
up stacked in ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I] (transformers' layout).
Experts run one at a time over the rows that picked them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from radixserve.layers.norm import RMSNorm
from radixserve.model_config import ModelConfig


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


class Gemma4Experts(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        g = cfg.gemma4
        num, width, hidden = g.num_experts, g.moe_intermediate_size, cfg.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(num, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(num, hidden, width))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            rows, slot = torch.where(ids == expert)
            gate, up = F.linear(x[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.gelu(gate, approximate="tanh") * up, self.down_proj[expert])
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out


def attach_moe(layer: nn.Module, cfg: ModelConfig) -> None:
    """Give a decoder ``layer`` the router, the experts and the three norms they add (under
    transformers' names, so its checkpoint names load as they are)."""
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
