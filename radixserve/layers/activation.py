"""SwiGLU and GeGLU on a fused gate/up projection: ``silu(gate) * up``, ``gelu_tanh(gate) * up``
(one native call on CPU float32 rows where the kernels load; they match torch's to float
rounding, layer_ops.cpp)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from radixserve.kernels import native


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    out = _native(gate_up, "rs_silu_mul")
    if out is not None:
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU on a fused gate/up projection (Gemma): ``gelu(gate, tanh approximation) * up``."""
    out = _native(gate_up, "rs_gelu_tanh_mul")
    if out is not None:
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _native(gate_up: torch.Tensor, kernel: str) -> torch.Tensor | None:
    """The kernel's result where it can run (float32 CPU rows, contiguous), else None."""
    lib = native.load()
    if not (lib is not None and gate_up.dtype == torch.float32 and gate_up.dim() == 2
            and gate_up.device.type == "cpu" and gate_up.is_contiguous()):
        return None
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2)
    getattr(lib, kernel)(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
    return out
