"""A vision encoder's matrices as its checkpoint stores them, and the linear layer each becomes.

`Matrix` is one weight in the file's own bytes (a GGUF tensor's blocks, a safetensors tensor's
float32 / float16 / bfloat16 values), rows = the layer's outputs. `make_linear` keeps those
bytes where the engine has a kernel for them: on the CPU with the native kernels an F16, BF16
or block-quantized (Q8_0, Q4_K, ...) matrix becomes a `BlockLinear` on the stored values
(float32 activations), exactly as the text model's GGUF / 16-bit folder loads do. A float32
matrix, or any matrix on another device (CUDA runs the engine's dtype, as the text model does
there), becomes an ``nn.Linear`` in the engine's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn
from torch.nn import functional as F

from radixserve.kernels import native
from radixserve.layers.block_linear import FORMATS, HALF_TYPES, K_QUANTS, BlockLinear
from radixserve.layers.gguf_quant import dequantize, to_torch
from radixserve.models.vision.attention_dtype import vision_matmul_dtype

_T = GGMLQuantizationType
_TORCH_TYPES = {torch.float32: _T.F32, torch.float16: _T.F16, torch.bfloat16: _T.BF16}
_WORDS = {_T.F32: torch.int32, _T.F16: torch.int16, _T.BF16: torch.int16}  # one element's bits


@dataclass(frozen=True)
class Matrix:
    """An [n, k] weight as stored: ``raw`` uint8 [n, bytes per row] of type ``qtype`` (a view
    of the file's mapping or tensor; never written)."""

    qtype: GGMLQuantizationType
    raw: torch.Tensor
    n: int
    k: int

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Matrix:
        """A safetensors tensor (float32, float16 or bfloat16; a conv kernel [n, c, h, w] is
        the matrix [n, c * h * w]) with its values as they are. ValueError for another dtype."""
        if t.dtype not in _TORCH_TYPES:
            raise ValueError(f"vision weight of dtype {t.dtype}; supported: "
                             f"{[str(d) for d in _TORCH_TYPES]}")
        rows = t.detach().contiguous().reshape(t.shape[0], -1)
        return cls(_TORCH_TYPES[t.dtype], rows.view(torch.uint8), rows.shape[0], rows.shape[1])

    @classmethod
    def from_gguf(cls, tensor) -> Matrix:
        """A GGUF ReaderTensor of 2 or more dimensions (numpy order [n, ...], the rest one row)."""
        shape = [int(d) for d in reversed(tensor.shape)]
        n, k = shape[0], math.prod(shape[1:])
        raw = to_torch(tensor.data).view(torch.uint8).reshape(n, -1)
        return cls(GGMLQuantizationType(tensor.tensor_type), raw, n, k)

    def floats(self) -> torch.Tensor:
        """The weight in float32, [n, k] (a new tensor)."""
        return dequantize(self.raw, self.qtype, (self.n, self.k))

    def transposed(self) -> Matrix:
        """The [k, n] matrix: float types keep their bits (an F16 weight stays F16); a block
        type cannot be transposed block-wise, so it becomes float32 values."""
        if self.qtype in _WORDS:
            words = self.raw.contiguous().view(_WORDS[self.qtype]).reshape(self.n, self.k)
            return Matrix(self.qtype, words.T.contiguous().view(torch.uint8), self.k, self.n)
        return Matrix(_T.F32, self.floats().T.contiguous().view(torch.uint8), self.k, self.n)


def runs_stored(m: Matrix, device: torch.device) -> bool:
    """True where ``m`` becomes a BlockLinear on its stored bytes (see the module docstring)."""
    if device.type != "cpu" or m.qtype not in FORMATS or native.load() is None:
        return False
    if m.qtype in HALF_TYPES:
        return True
    block = 256 if m.qtype in K_QUANTS else 32
    return m.k % block == 0 and m.k % GGML_QUANT_SIZES[m.qtype][0] == 0


def make_linear(m: Matrix, bias: torch.Tensor | None, device: torch.device,
                dtype: torch.dtype) -> nn.Module:
    """``y = x @ W.T + bias`` for ``x`` [M, k] → [M, n] in ``x``'s dtype: a `Bf16Linear` for
    a 16-bit matrix where the tower multiplies in bfloat16 (attention_dtype.py
    `vision_matmul_dtype`: AMX), a BlockLinear on the stored bytes where ``runs_stored``,
    else an ``nn.Linear`` in ``dtype`` on ``device``."""
    if m.qtype in (_T.F16, _T.BF16) and dtype == torch.float32:
        matmul, _ = vision_matmul_dtype(device, dtype)
        if matmul == torch.bfloat16:
            return Bf16Linear(m, bias, device)
    if runs_stored(m, device):
        layer = BlockLinear.from_stored([(m.qtype, m.raw)], m.k, bias)
        if layer is not None:
            return layer
    layer = nn.Linear(m.k, m.n, bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(m.floats().to(device=device, dtype=dtype), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.to(device=device, dtype=dtype), requires_grad=False)
    return layer


class Bf16Linear(nn.Linear):
    """A 16-bit matrix multiplied in bfloat16 (float32 in and out, the bias added in float32):
    the F16 / BF16 weight held as bfloat16 (exact for the releases' bfloat16 values), the
    activations rounded to bfloat16, the products summed in float32 by torch's GEMM (oneDNN:
    AMX tiles where the CPU has them)."""

    def __init__(self, m: Matrix, bias: torch.Tensor | None, device: torch.device) -> None:
        super().__init__(m.k, m.n, bias=bias is not None, device="meta")
        self.stored = m.qtype.name
        self.weight = nn.Parameter(m.floats().to(device=device, dtype=torch.bfloat16),
                                   requires_grad=False)
        if bias is not None:
            self.bias = nn.Parameter(bias.to(device=device, dtype=torch.float32),
                                     requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def describe_linear(layer: nn.Module) -> str:
    """How a layer made by `make_linear` holds its weight, for the load's log line."""
    if isinstance(layer, BlockLinear):
        return f"{'+'.join(layer.types)} as stored"
    if isinstance(layer, Bf16Linear):
        return f"{layer.stored} as bfloat16 GEMM"
    return str(layer.weight.dtype).removeprefix("torch.")
