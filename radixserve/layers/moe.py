"""Sparse mixture-of-experts block (Qwen2-MoE, Qwen3-MoE, Mixtral, Qwen3.5-MoE; with sigmoid
routing Nemotron-H, LFM2-MoE): a router picks ``top_k`` experts per token; the token's output is
their outputs weighted by the router, plus a shared expert's where the model has one.

Routing, as transformers computes it for these families (``MoeConfig``)::

    p = softmax(router(x))            float32, over all experts ("softmax" scoring)
    w, e = topk(p, k)                 the k largest, rank 0 first
  or ("softmax_topk", gpt-oss)
    l, e = topk(router(x), k); w = softmax(l)
  or ("sigmoid" scoring, DeepSeek-V3 style)
    s = sigmoid(router(x))            each expert's score alone
    c = s + expert_bias               selection only (``expert_bias``), within the
                                      ``topk_groups`` best groups (a group by its two best c)
    e = topk(c, k); w = s[e]
  then
    w = w / (sum(w) + norm_eps)       when norm_topk_prob (always for Mixtral, where it equals
                                      a softmax over the chosen k logits)
    w = w * routed_scaling
    y = sum_r w[r] * expert_e[r](x)
    y = y + sigmoid(g(x)) * shared(x) g a linear of one output (no gate where not
                                      ``shared_expert_gate``), shared an expert of its own
                                      width that every token runs

Experts are SwiGLU (``gate_up_proj``, ``down_proj``) or, for ``expert_activation`` "relu2"
(Nemotron-H), ``down(relu(up(x)) ** 2)`` with no gate, or "swiglu_oai" (gpt-oss: clamped, with
biases, ``OaiExpert``).

The experts run batched by expert over the step's packed batch: the (token, rank) assignments
are sorted by expert (stably, so by token within one), and each expert that has tokens runs
its gate_up and its down once on its gathered rows; experts no token picked do not run (at
decode, at most T * k of them). Each result goes back to its (token, rank) slot and a token's
k results are summed in rank order, one elementwise op at a time.

NOTE: batch invariance follows from the linears': the native ones (`BlockLinear`,
`Int8Linear`, the router among them when the model is quantized) give a row the same bits in
any batch, softmax / top-k / SiLU are per row (the shared expert's sigmoid gate made so, see
``_row_sigmoid``; sigmoid scores through the scalar native kernel where ``native``), relu2 is
exact per element (as are swiglu_oai's clamps, products and sums; its sigmoid is the scalar
native kernel's where ``native``), and the combine is elementwise in a fixed order,
so a token's output does not depend on which other tokens share its step or its experts. Float
linears (torch / MKL sgemm) are not row-batch-invariant (a row's bits change with M from M = 2
on), exactly as the dense layers of a float model are not.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
from torch import nn

from radixserve.kernels import recurrent_ops
from radixserve.layers.activation import silu_and_mul
from radixserve.model_config import MoeConfig


class Expert(nn.Module):
    """One SwiGLU expert: gate and up fused in one linear, as the dense MLP."""

    activation: ClassVar[str] = "silu"

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.native = False  # the activation's kernel, set by the model's KernelPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.native))


class Relu2Expert(nn.Module):
    """One non-gated expert (Nemotron-H): ``down(relu(up(x)) ** 2)``, exact per element (no
    kernel choice)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up_proj(x))
        return self.down_proj(h * h)


class OaiExpert(nn.Module):
    """One gpt-oss expert: gate and up fused in one linear with biases (gate rows, then up
    rows), ``down((clamp(up, -l, l) + 1) * g * sigmoid(alpha * g))``, g = ``min(gate, l)``
    (``MoeConfig.swiglu_limit`` l and ``swiglu_alpha``)."""

    activation: ClassVar[str] = "swiglu_oai"

    def __init__(self, hidden_size: int, intermediate_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=True)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=True)
        self.limit, self.alpha = moe.swiglu_limit, moe.swiglu_alpha
        self.native = False  # the sigmoid's scalar kernel, set by the model's KernelPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit).contiguous()
        up = up.clamp(-self.limit, self.limit)
        glu = (recurrent_ops.sigmoid_mul(gate, gate * self.alpha) if self.native
               else gate * torch.sigmoid(gate * self.alpha))
        return self.down_proj((up + 1) * glu)


class SparseMoeBlock(nn.Module):
    """``x`` [T, hidden] → [T, hidden]. ``gate`` is the router (a linear like the others, so a
    quantized model computes it in its native, batch-invariant kernels); ``expert_bias`` [E]
    float32 (``MoeConfig.expert_bias``: checkpoints call it ``e_score_correction_bias`` or
    ``expert_bias``; families map it here) is the selection bias."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.moe = moe
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=moe.linear_bias)
        expert = Relu2Expert if moe.expert_activation == "relu2" else Expert
        if moe.expert_activation == "swiglu_oai":
            expert = functools.partial(OaiExpert, moe=moe)
        self.experts = nn.ModuleList(expert(hidden_size, moe.intermediate_size)
                                     for _ in range(moe.num_experts))
        self.expert_bias = (nn.Parameter(torch.zeros(moe.num_experts), requires_grad=False)
                            if moe.expert_bias else None)
        size = moe.shared_expert_size
        self.shared_expert = expert(hidden_size, size) if size else None
        self.shared_expert_gate = (nn.Linear(hidden_size, 1, bias=False)
                                   if size and moe.shared_expert_gate else None)
        self.native = False  # sigmoid scores by the scalar kernel; set by the model's KernelPlan

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k] int64), rank 0 the best."""
        logits = self.gate(x).float()
        if self.moe.scoring == "softmax":
            weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        elif self.moe.scoring == "softmax_topk":
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1)
        else:
            scores = (recurrent_ops.sigmoid_mul(torch.ones_like(logits), logits)
                      if self.native else torch.sigmoid(logits))
            ids = torch.topk(self._choice(scores), self.top_k, dim=-1)[1]
            weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + self.moe.norm_eps)
        if self.moe.routed_scaling != 1.0:
            weights = weights * self.moe.routed_scaling
        return weights, ids

    def _choice(self, scores: torch.Tensor) -> torch.Tensor:
        """The scores experts are picked by: plus the bias, outside the best groups -inf."""
        choice = scores if self.expert_bias is None else scores + self.expert_bias.float()
        groups, keep = self.moe.num_groups, self.moe.topk_groups
        if groups == 1 or keep == groups:
            return choice
        by_group = choice.view(choice.shape[0], groups, -1)
        group_scores = by_group.topk(2, dim=-1)[0].sum(dim=-1)
        kept = torch.zeros_like(group_scores, dtype=torch.bool)
        kept.scatter_(1, torch.topk(group_scores, keep, dim=-1)[1], True)
        return by_group.masked_fill(~kept[:, :, None], float("-inf")).view_as(choice)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_tokens, k = x.shape[0], self.top_k
        weights, ids = self.route(x)
        # assignment j = (token j // k, rank j % k); sorted by expert, then by j
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = x.new_empty(num_tokens * k, x.shape[1])
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                picked = order[start:start + count]
                out.index_copy_(0, picked, expert(x.index_select(0, picked // k)))
                start += count
        out = out.view(num_tokens, k, -1)
        weights = weights.to(x.dtype)
        y = out[:, 0] * weights[:, :1]
        for rank in range(1, k):
            y += out[:, rank] * weights[:, rank:rank + 1]
        if self.shared_expert_gate is not None:
            y += _row_sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        elif self.shared_expert is not None:
            y += self.shared_expert(x)
        return y

    def extra_repr(self) -> str:
        shared = "" if self.shared_expert is None else ", shared expert"
        return (f"experts={len(self.experts)}, top_k={self.top_k}, "
                f"norm={self.norm_topk_prob}, {self.moe.scoring}{shared}")


def _row_sigmoid(g: torch.Tensor) -> torch.Tensor:
    """sigmoid of a [T, 1] column, each row's bits independent of T: softmax([0, g])[1].

    NOTE: torch's elementwise CPU kernels (sigmoid, exp) compute the elements a vector loop
    does not reach, at the end of the tensor or of a thread's share, with the scalar
    function, whose bits may differ from the vector one's; so on the column a row's gate would
    change with the batch. A last-dim softmax computes each row alone, as the router's does."""
    return torch.softmax(torch.cat((torch.zeros_like(g), g), dim=-1), dim=-1)[:, 1:]
