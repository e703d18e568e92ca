"""4-bit linear layer for CPUs: GGUF's Q4_0 / Q4_1 blocks as they are in the file.

``y = x @ W.T + bias`` with ``W = d * q + m`` per 32 weights (4-bit codes ``q``, f16 ``d`` and
``m``), so a decode step reads 5 bits per weight instead of the 8 of ``Int8Linear`` (and the
weights are exactly the file's, where ``Int8Linear`` rounds them again per channel). The
activations are quantized per row and block of 32 in two terms (~11 bits); the integer sum of
each block is exact and the float accumulation runs block by block in one fixed order, so a
row's output is bit-identical alone or in any batch, on the VNNI path (a few rows) and on the
AMX path (more rows) alike. The numerics are stated in ``kernels/q4_linear.cpp``.

It exists only where the native kernels load (``--quantization q4`` is refused elsewhere, see
``models/quantization.py``).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from radixserve.kernels import native


class Q4Linear(nn.Module):
    """``x`` [M, in_features] (any float dtype; K a multiple of 32) → [M, out_features] in
    ``x``'s dtype. Build it with ``from_blocks`` (None where the native kernels do not load)."""

    def __init__(self, lib: ctypes.CDLL, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        n, k = q.shape
        self.register_buffer("packed", torch.empty((n + 15) // 16 * (k // 32) * 320,
                                                   dtype=torch.uint8))
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        lib.rs_q4_pack(q.contiguous().data_ptr(), d.contiguous().view(torch.int16).data_ptr(),
                       m.contiguous().view(torch.int16).data_ptr(), n, k,
                       self.packed.data_ptr())
        self._call = lib.rs_q4_linear
        self._args = (self.packed.data_ptr(), None if bias is None else self.bias.data_ptr(), n)

    @classmethod
    def from_blocks(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                    bias: torch.Tensor | None = None) -> Q4Linear | None:
        """``q`` [N, K] uint8 codes 0..15, ``d`` and ``m`` [N, K / 32] float16 (as
        ``gguf_quant.q4_blocks`` gives them). ValueError on shapes that do not fit."""
        n, k = q.shape
        if q.dtype != torch.uint8 or k % 32 or d.shape != (n, k // 32) or m.shape != d.shape:
            raise ValueError(f"Q4 blocks of mismatched shapes: q {tuple(q.shape)} {q.dtype}, "
                             f"d {tuple(d.shape)}, m {tuple(m.shape)}")
        lib = native.load()
        return None if lib is None else cls(lib, q, d.to(torch.float16), m.to(torch.float16),
                                            bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float().contiguous()
        m = xf.shape[0]
        y = torch.empty(m, self.out_features, dtype=torch.float32)
        if m and self._call(xf.data_ptr(), m, self.in_features, *self._args, y.data_ptr(),
                            self.out_features):
            raise MemoryError("native 4-bit linear: scratch allocation failed")
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q4 blocks")
