"""Rotary position embedding (HF "rotate half" layout) with default, linear and llama3 scaling.

On CPU with float32 q/k and the native kernels loaded, q and k are rotated in place in one call
(``kernels/layer_ops.cpp``), bit-identical to the torch ops.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from radixserve.kernels import native

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")


def _inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    if rope_type == "freq_factors":  # GGUF stores llama3 scaling as per-dimension divisors
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64)
    raise ValueError(f"unsupported rope scaling {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")


def _llama3_scale(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend in between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by position; applied to q and k of shape [T, heads, d]."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict | None) -> None:
        super().__init__()
        self.args = (head_dim, max_positions, theta, scaling)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.reset_tables()
        self._native = native.load()

    def reset_tables(self, device: torch.device | None = None) -> None:
        """(Re)compute the tables, e.g. after the model was built on the meta device."""
        head_dim, max_positions, theta, scaling = self.args
        inv_freq = _inv_freq(head_dim, theta, scaling).float()
        t = torch.arange(max_positions, dtype=torch.float32)
        emb = torch.outer(t, inv_freq).repeat(1, 2)
        self.cos = emb.cos().to(device or self.cos.device)
        self.sin = emb.sin().to(device or self.sin.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, d], k [T, KVH, d] → rotated (q, k); the native path rotates them in place
        and returns the same tensors."""
        if (self._native is not None and _native_ok(q) and _native_ok(k) and self.cos.is_cpu
                and positions.dtype == torch.int64 and positions.is_contiguous()):
            num_rows, num_heads, head_dim = q.shape
            self._native.rs_rotary(q.data_ptr(), q.stride(0), num_heads, k.data_ptr(),
                                   k.stride(0), k.shape[1], num_rows, head_dim,
                                   positions.data_ptr(), self.cos.data_ptr(), self.sin.data_ptr())
            return q, k
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return _apply(q, cos, sin), _apply(k, cos, sin)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _native_ok(x: torch.Tensor) -> bool:
    """float32 on CPU, heads of a row contiguous (a row stride of its own is fine)."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(2) == 1
            and x.stride(1) == x.shape[2])
