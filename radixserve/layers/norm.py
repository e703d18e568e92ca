"""RMSNorm, computed in float32 whatever the activation dtype (as HF Llama does), optionally
fused with the residual add before it (``norm(x, residual)``, as vLLM's layers do).

On CPU with float32 rows (or heads: q/k norms on [T, heads, head_dim], each row's heads
contiguous) and the native kernels loaded, one call per norm (``kernels/layer_ops.cpp``); it
sums in its own order, so it matches the torch version to float rounding (a process uses one or
the other throughout, and each row on its own).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import native


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self._native = native.load()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``(norm(x + residual), x + residual)``, where the
        sum may be written into ``residual`` in place."""
        if self._native is not None and residual is None and _heads_ok(x):
            return self._native_heads(x)
        if self._native is not None and _native_ok(x) and (residual is None or
                                                           _native_ok(residual)):
            return self._native_forward(x, residual)
        if residual is not None:
            residual = x + residual
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def _native_forward(self, x: torch.Tensor, residual: torch.Tensor | None
                        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One kernel call; with ``residual`` the sum is written into it in place."""
        rows, dim = x.shape
        out = torch.empty_like(x)
        w = self.weight.data_ptr()
        if residual is None:
            self._native.rs_rms_norm(x.data_ptr(), dim, w, rows, dim, self.eps, out.data_ptr(),
                                     dim)
            return out
        self._native.rs_add_rms_norm(x.data_ptr(), residual.data_ptr(), w, rows, dim, self.eps,
                                     out.data_ptr())
        return out, residual

    def _native_heads(self, x: torch.Tensor) -> torch.Tensor:
        """q/k norms: each head of x [T, heads, d] on its own, into a contiguous tensor."""
        rows, heads, dim = x.shape
        out = torch.empty(rows, heads, dim)
        self._native.rs_head_rms_norm(x.data_ptr(), x.stride(0), self.weight.data_ptr(), rows,
                                      heads, dim, self.eps, out.data_ptr(), heads * dim)
        return out


def _heads_ok(x: torch.Tensor) -> bool:
    """[T, heads, d] float32 on CPU, each row's heads contiguous (a row stride of its own)."""
    return (x.dtype == torch.float32 and x.dim() == 3 and x.device.type == "cpu"
            and x.stride(2) == 1 and x.stride(1) == x.shape[2])


def _native_ok(x: torch.Tensor) -> bool:
    return (x.dtype == torch.float32 and x.dim() == 2 and x.device.type == "cpu"
            and x.is_contiguous())
