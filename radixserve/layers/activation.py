"""SwiGLU on a fused gate/up projection: ``silu(gate) * up``."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
