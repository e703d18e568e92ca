"""A row-parallel linear layer of a tensor-parallel rank (models/tp_shard.py): the rank's
input columns of the matrix, then the sum of every rank's partial output (one all-reduce)."""

from __future__ import annotations

import torch
from torch import nn


class RowParallelLinear(nn.Module):
    """``y = all_reduce(local(x))``: ``local`` holds this rank's columns (any linear kind);
    ``comm.all_reduce(t)`` sums ``t`` in place over the ranks, the same bits on each."""

    def __init__(self, local: nn.Module, comm) -> None:
        super().__init__()
        self.local = local
        self.comm = comm
        self.in_features, self.out_features = local.in_features, local.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.local(x).contiguous())
