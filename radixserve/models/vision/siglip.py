"""The SigLIP vision transformer as Gemma 3 uses it (no pooling head): pixels → patch states.

``pixels`` [n, C, H, W] → patches of ``patch_size``² (the conv of the checkpoint as a linear
over each flattened patch, channel-major like the conv kernel) + learned position embeddings →
``num_layers`` pre-norm blocks (LayerNorm → multi-head attention with biases, every patch
seeing every patch → LayerNorm → MLP fc1 / gelu-tanh / fc2) → the post LayerNorm:
[n, num_patches, hidden]. Weights come from a `VisionWeights` (models/vision/weights.py) by
their Hugging Face names under ``vision_model.``; the matrices keep their stored type
(models/vision/stored.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.layer_progress import layer_done
from radixserve.models.vision.attention_dtype import vision_attention_dtype
from radixserve.models.vision.stored import Matrix, make_linear


@dataclass(frozen=True)
class SiglipConfig:
    """The tower's shape (Hugging Face ``vision_config`` / GGUF ``clip.vision.*``)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    num_channels: int = 3

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2


class _Parts:
    """Builds a tower's layers from ``weights`` on ``device`` in ``dtype`` (one load)."""

    def __init__(self, weights, device: torch.device, dtype: torch.dtype) -> None:
        self.weights, self.device, self.dtype = weights, device, dtype

    def linear(self, name: str, n: int, k: int) -> nn.Module:
        """The [n, k] layer ``name`` with its bias; ValueError for another shape."""
        matrix = self.weights.matrix(f"{name}.weight")
        if (matrix.n, matrix.k) != (n, k):
            raise ValueError(f"vision weight {name}.weight of shape {(matrix.n, matrix.k)}, "
                             f"expected {(n, k)}")
        bias = self.weights.tensor(f"{name}.bias")
        return make_linear(matrix, bias, self.device, self.dtype)

    def fused(self, names: list[str], n: int, k: int) -> nn.Module | None:
        """One layer for the [n, k] layers ``names`` stacked by rows (one GEMM instead of
        several: q, k, v), or None where their matrices are stored in different types."""
        matrices = [self.weights.matrix(f"{name}.weight") for name in names]
        if len({m.qtype for m in matrices}) != 1:
            return None
        for name, m in zip(names, matrices):
            if (m.n, m.k) != (n, k):
                raise ValueError(f"vision weight {name}.weight of shape {(m.n, m.k)}, "
                                 f"expected {(n, k)}")
        stacked = Matrix(matrices[0].qtype, torch.cat([m.raw for m in matrices]),
                         n * len(names), k)
        bias = torch.cat([self.weights.tensor(f"{name}.bias") for name in names])
        return make_linear(stacked, bias, self.device, self.dtype)

    def tensor(self, name: str) -> nn.Parameter:
        t = self.weights.tensor(name)
        return nn.Parameter(t.to(device=self.device, dtype=self.dtype), requires_grad=False)

    def layer_norm(self, name: str, eps: float) -> nn.LayerNorm:
        weight = self.tensor(f"{name}.weight")
        norm = nn.LayerNorm(weight.shape[0], eps=eps, device="meta")
        norm.weight, norm.bias = weight, self.tensor(f"{name}.bias")
        return norm


class SiglipAttention(nn.Module):
    def __init__(self, config: SiglipConfig, parts: _Parts, prefix: str) -> None:
        super().__init__()
        self.num_heads, dim = config.num_heads, config.hidden_size
        # the scores' and weighted sums' element type (models/vision/attention_dtype.py)
        self.compute_dtype: torch.dtype | None = None
        names = [f"{prefix}.{p}_proj" for p in "qkv"]
        self.qkv_proj = parts.fused(names, dim, dim)
        self.q_proj, self.k_proj, self.v_proj = (
            [None] * 3 if self.qkv_proj is not None else
            [parts.linear(name, dim, dim) for name in names])
        self.out_proj = parts.linear(f"{prefix}.out_proj", dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [n, P, D] → [n, P, D]; no mask: a patch attends to every patch of its image."""
        n, num_patches, dim = x.shape
        flat = x.reshape(n * num_patches, dim)

        def heads(rows: torch.Tensor) -> torch.Tensor:
            return rows.reshape(n, num_patches, self.num_heads, -1).transpose(1, 2)

        if self.qkv_proj is not None:
            q, k, v = (heads(t) for t in self.qkv_proj(flat).split(dim, dim=-1))
        else:
            q, k, v = (heads(proj(flat)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        cast = self.compute_dtype not in (None, q.dtype)
        if cast:
            q, k, v = q.to(self.compute_dtype), k.to(self.compute_dtype), v.to(self.compute_dtype)
        out = F.scaled_dot_product_attention(q, k, v)  # scale: head_dim ** -0.5
        if cast:
            out = out.to(x.dtype)
        out = out.transpose(1, 2).reshape(n * num_patches, dim)
        return self.out_proj(out).view(n, num_patches, dim)


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: SiglipConfig, parts: _Parts, prefix: str) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.layer_norm1 = parts.layer_norm(f"{prefix}.layer_norm1", eps)
        self.self_attn = SiglipAttention(config, parts, f"{prefix}.self_attn")
        self.layer_norm2 = parts.layer_norm(f"{prefix}.layer_norm2", eps)
        dim, inner = config.hidden_size, config.intermediate_size
        self.fc1 = parts.linear(f"{prefix}.mlp.fc1", inner, dim)
        self.fc2 = parts.linear(f"{prefix}.mlp.fc2", dim, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        h = self.layer_norm2(x)
        shape = h.shape
        h = self.fc2(F.gelu(self.fc1(h.reshape(-1, shape[-1])), approximate="tanh"))
        return x + h.view(shape)


class SiglipVisionTower(nn.Module):
    """``forward(pixels [n, C, H, W])`` → [n, num_patches, hidden] in the tower's dtype."""

    def __init__(self, config: SiglipConfig, weights, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        parts = _Parts(weights, device, dtype)
        self.config, self.dtype = config, dtype
        self.patch_embedding = parts.linear(
            "embeddings.patch_embedding", config.hidden_size,
            config.num_channels * config.patch_size ** 2)
        self.position_embedding = parts.tensor("embeddings.position_embedding.weight")
        expected = (config.num_patches, config.hidden_size)
        if tuple(self.position_embedding.shape) != expected:
            raise ValueError(f"vision position embedding of shape "
                             f"{tuple(self.position_embedding.shape)}, expected {expected}")
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(config, parts, f"encoder.layers.{i}")
            for i in range(config.num_layers))
        self.post_layernorm = parts.layer_norm("post_layernorm", config.layer_norm_eps)
        self.attention_dtype, self.attention_why = vision_attention_dtype(device, dtype)
        for layer in self.layers:
            layer.self_attn.compute_dtype = self.attention_dtype

    def patches(self, pixels: torch.Tensor) -> torch.Tensor:
        """[n, C, H, W] → [n, num_patches, C * p * p]: patches in row-major grid order, each
        flattened as (channel, row, column), the conv kernel's order."""
        n, c, height, width = pixels.shape
        p = self.config.patch_size
        grid = pixels.reshape(n, c, height // p, p, width // p, p)
        return grid.permute(0, 2, 4, 1, 3, 5).reshape(n, -1, c * p * p)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patches(pixels.to(self.dtype))
        n, num_patches, k = patches.shape
        x = self.patch_embedding(patches.reshape(n * num_patches, k)).view(n, num_patches, -1)
        x = x + self.position_embedding
        for layer in self.layers:
            x = layer(x)
            layer_done()  # a long encode is progress, not a hang (layers/layer_progress.py)
        return self.post_layernorm(x)
