"""Sparse mixture-of-experts block (Qwen3-MoE, Mixtral): a router picks ``top_k`` SwiGLU
experts per token; the token's output is their outputs weighted by the router.

Routing, as transformers computes it for both families::

    p = softmax(router(x))            float32, over all experts
    w, e = topk(p, k)                 the k largest, rank 0 first
    w = w / sum(w)                    when norm_topk_prob (always for Mixtral, where it equals
                                      a softmax over the chosen k logits)
    y = sum_r w[r] * expert_e[r](x)

The experts run batched by expert over the step's packed batch: the (token, rank) assignments
are sorted by expert (stably, so by token within one), and each expert that has tokens runs
its gate_up and its down once on its gathered rows; experts no token picked do not run (at
decode, at most T * k of them). Each result goes back to its (token, rank) slot and a token's
k results are summed in rank order, one elementwise op at a time.

NOTE: batch invariance follows from the linears': the native ones (`BlockLinear`,
`Int8Linear`, the router among them when the model is quantized) give a row the same bits in
any batch, softmax / top-k / SiLU are per row, and the combine is elementwise in a fixed order,
so a token's output does not depend on which other tokens share its step or its experts. Float
linears (torch / MKL sgemm) are not row-batch-invariant (a row's bits change with M from M = 2
on), exactly as the dense layers of a float model are not.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.config import MoeConfig
from radixserve.layers.activation import silu_and_mul


class Expert(nn.Module):
    """One SwiGLU expert: gate and up fused in one linear, as the dense MLP."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """``x`` [T, hidden] → [T, hidden]. ``gate`` is the router (a linear like the others, so a
    quantized model computes it in its native, batch-invariant kernels)."""

    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden_size, moe.intermediate_size)
                                     for _ in range(moe.num_experts))

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
        return y

    def extra_repr(self) -> str:
        return f"experts={len(self.experts)}, top_k={self.top_k}, norm={self.norm_topk_prob}"
