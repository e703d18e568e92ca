"""SwiGLU and GeGLU on a fused gate/up projection: ``silu(gate) * up``, ``gelu_tanh(gate) * up``
(``native``: one call into the kernels on float32 CPU rows, chosen per model by its
``KernelPlan``; they match torch's to float rounding, layer_ops.cpp)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from radixserve.kernels import ops


def silu_and_mul(gate_up: torch.Tensor, native: bool = False) -> torch.Tensor:
    if native:
        return ops.glu(gate_up, "silu")
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor, native: bool = False) -> torch.Tensor:
    """GeGLU on a fused gate/up projection (Gemma): ``gelu(gate, tanh approximation) * up``."""
    if native:
        return ops.glu(gate_up, "gelu_tanh")
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
