"""Int8 linear layer for CPUs: int8 weights, activations as two int8 terms, exact int32 sums.

Weights are quantized once, per output channel (symmetric, ``w ≈ w_scale[n] * wq[n, k]``).
Each activation row is quantized at run time with its own scale, in two terms::

    t  = x / s,  s = max|x| / 127          (so |t| <= 127)
    hi = round(t)                          int8
    lo = round((t - hi) * 254)             int8, since |t - hi| <= 1/2
    x  ≈ s * (hi + lo / 254)               about 15 bits per row instead of 8

and both terms go through one int8 GEMM (``[hi; lo]`` stacked as 2M rows), so
``y = s * (hi·wq + lo·wq / 254) * w_scale``. The error is then almost all weight rounding:
on SmolLM2-135M the logits stay within KL 0.006 of the float model, where one int8 term per
row (the usual W8A8) gives 0.056.

NOTE: batch invariance holds by construction: the integer dot products are exact whatever
blocking the GEMM picks for a given number of rows, the row scale depends only on its row, and
everything after is elementwise with one rounding per op. So a row's output is bit-identical
alone or in any batch, which float GEMMs (oneDNN's bf16 in particular) do not promise.

The engine runs the layer as one call into the native kernel ``int8_linear.cpp`` (row
quantization, both terms in one pass over the weights, the epilogue), at every CPU level
(``kernels/levels.py``) with the same bits, and bit-identical to the torch ops below.

Where the kernels are missing the layer computes with torch ops and ``torch._int_mm``: the
tests' reference, not a serving path (``models/quantization.py`` refuses int8 there; oneDNN's
int8 GEMM, once the fallback, was measured far slower than fp32 on CPUs without AMX).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import native, ops

_LO = 254.0  # the low term's scale relative to the high one
_TINY = 1e-30  # floor of a row's max, so an all-zero row quantizes to zeros


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] float → (``[hi; lo]`` [2M, K] int8, row scale ``s`` [M, 1] float32)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_(min=_TINY).div_(127.0)
    t = x / scale
    hi = t.round()
    lo = t.sub_(hi).mul_(_LO).round_()
    return torch.cat((hi, lo)).to(torch.int8), scale


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] float → (int8 [N, K], per-channel scale [N] float32)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_(min=_TINY) / 127.0
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


class Int8Linear(nn.Module):
    """``y = x @ weight.T + bias`` from int8 weights; ``x`` is [M, in_features], any float dtype
    (the output has the same dtype). Build it with ``from_float``."""

    def __init__(self, qweight: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        # the weight in the native kernel's layout where the kernels load (decided once, here)
        self._native = _native_weight(qweight, w_scale, self.bias)
        if self._native is None:
            self.register_buffer("qweight", qweight)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        if weight.device.type != "cpu":
            raise ValueError("int8 quantization runs on CPU only")
        qweight, scale = quantize_weight(weight)
        return cls(qweight, scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.shape[0]
        if self._native is not None:
            y = ops.int8_linear(x.float().contiguous(), self._native)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        q, scale = quantize_rows(x)
        out = torch._int_mm(q, self.qweight.t()).float().mul_(self.w_scale)  # [hi; lo]·wq·ws
        y, lo = out[:num_rows], out[num_rows:]
        y.add_(lo.mul_(1.0 / _LO)).mul_(scale)
        if self.bias is not None:
            y += self.bias
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8")



def _native_weight(qweight: torch.Tensor, w_scale: torch.Tensor,
                   bias: torch.Tensor | None) -> ops.Int8Weight | None:
    """``qweight`` packed for ``ops.int8_linear``; None where the kernels do not load."""
    return None if native.load() is None else ops.Int8Weight(qweight, w_scale, bias)
