"""Sparse mixture-of-experts block (Qwen2-MoE, Qwen3-MoE, Mixtral): a router picks ``top_k``
SwiGLU experts per token; the token's output is their outputs weighted by the router, plus a
shared expert's where the model has one (Qwen2-MoE).

Routing, as transformers computes it for these families::

    p = softmax(router(x))            float32, over all experts
    w, e = topk(p, k)                 the k largest, rank 0 first
    w = w / sum(w)                    when norm_topk_prob (always for Mixtral, where it equals
                                      a softmax over the chosen k logits)
    y = sum_r w[r] * expert_e[r](x)
    y = y + sigmoid(g(x)) * shared(x) Qwen2-MoE: g a linear of one output, shared a SwiGLU
                                      expert of its own width that every token runs

The experts run batched by expert over the step's packed batch: the (token, rank) assignments
are sorted by expert (stably, so by token within one), and each expert that has tokens runs
its gate_up and its down once on its gathered rows; experts no token picked do not run (at
decode, at most T * k of them). Each result goes back to its (token, rank) slot and a token's
k results are summed in rank order, one elementwise op at a time.

NOTE: batch invariance follows from the linears': the native ones (`BlockLinear`,
`Int8Linear`, the router among them when the model is quantized) give a row the same bits in
any batch, softmax / top-k / SiLU are per row (the shared expert's sigmoid gate made so, see
``_row_sigmoid``), and the combine is elementwise in a fixed order,
so a token's output does not depend on which other tokens share its step or its experts. Float
linears (torch / MKL sgemm) are not row-batch-invariant (a row's bits change with M from M = 2
on), exactly as the dense layers of a float model are not.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from radixserve.model_config import MoeConfig
from radixserve.layers.activation import silu_and_mul


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


class SparseMoeBlock(nn.Module):
    """``x`` [T, hidden] → [T, hidden]. ``gate`` is the router (a linear like the others, so a
    quantized model computes it in its native, batch-invariant kernels)."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden_size, moe.intermediate_size)
                                     for _ in range(moe.num_experts))
        size = moe.shared_expert_size
        self.shared_expert = Expert(hidden_size, size) if size else None
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if size else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k] int64), rank 0 the most probable."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

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
        if self.shared_expert is not None:
            y += _row_sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return y

    def extra_repr(self) -> str:
        shared = "" if self.shared_expert is None else ", shared expert"
        return (f"experts={len(self.experts)}, top_k={self.top_k}, "
                f"norm={self.norm_topk_prob}{shared}")


def _row_sigmoid(g: torch.Tensor) -> torch.Tensor:
    """sigmoid of a [T, 1] column, each row's bits independent of T: softmax([0, g])[1].

    NOTE: torch's elementwise CPU kernels (sigmoid, exp) compute the elements a vector loop
    does not reach, at the end of the tensor or of a thread's share, with the scalar
    function, whose bits may differ from the vector one's; so on the column a row's gate would
    change with the batch. A last-dim softmax computes each row alone, as the router's does."""
    return torch.softmax(torch.cat((torch.zeros_like(g), g), dim=-1), dim=-1)[:, 1:]
