"""SwiGLU on a fused gate/up projection: ``silu(gate) * up`` (one native call on CPU float32
rows where the kernels load; its exp matches torch's to float rounding)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from radixserve.kernels import native


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    lib = native.load()
    if (lib is not None and gate_up.dtype == torch.float32 and gate_up.dim() == 2
            and gate_up.device.type == "cpu" and gate_up.is_contiguous()):
        rows, width = gate_up.shape
        out = torch.empty(rows, width // 2)
        lib.rs_silu_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU on a fused gate/up projection (Gemma): ``gelu(gate, tanh approximation) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
