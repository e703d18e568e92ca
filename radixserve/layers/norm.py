"""RMSNorm, computed in float32 whatever the activation dtype (as HF Llama does), optionally
fused with the residual add before it (``norm(x, residual)``, as vLLM's layers do).

Where the model's ``KernelPlan`` says so (``native``: float32 rows on CPU, the kernels
loaded), one call per norm (``kernels/layer_ops.cpp``), on rows [T, dim] or, for q/k norms,
heads [T, heads, head_dim] (each row's heads contiguous); it sums in its own order, so it
matches the torch version to float rounding (a model uses one or the other throughout, and
each row on its own).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.native = False  # set by the model's KernelPlan (models/native_stack.py)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``, where the
        sum may be written into ``residual`` in place."""
        if self.native:
            if residual is not None:
                return ops.add_rms_norm(x, residual, self.weight, self.eps), residual
            if x.dim() == 3:  # q/k norms: each head on its own
                return ops.head_rms_norm(x, self.weight, self.eps)
            return ops.rms_norm(x, self.weight, self.eps)
        if residual is not None:
            residual = x + residual
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
