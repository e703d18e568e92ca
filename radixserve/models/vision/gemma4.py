"""Gemma 4's vision encoder (transformers' ``Gemma4VisionModel`` + ``Gemma4MultimodalEmbedder``,
``get_image_features``' rows): one image's patches → the text model's image rows.

An image is the processor's pixels ``[ph, pw, P * P * 3]`` (multimodal/gemma4.py: the real
patches of transformers' ``pixel_values``, row-major, each patch's values in (row, column,
channel) order, in [0, 1]). Then:

- ``2 * (x - 0.5)``, the bias-free ``input_proj`` over each patch, plus the x (column) and y
  (row) rows of the 2-row position table;
- ``num_layers`` blocks, every norm Gemma 4's RMSNorm (``x * w`` in float32):
  input norm → attention (q / k / v projections, per-head RMSNorm of q and k, scale-free of v;
  2-D rotary on q and k: the first half of each head turns by the column, the second by the
  row, neox halves within each; scores unscaled; every patch sees every patch of its image)
  → o projection → post-attention norm → residual; pre-MLP norm → ``down(gelu_tanh(gate(x)) *
  up(x))`` → post-MLP norm → residual. A linear with clipping bounds (``use_clipped_linears``)
  clamps its input and output;
- the pooler: the mean of each ``k x k`` block of patches (k = ``pooling_kernel_size``),
  row-major over the pooled grid, times ``sqrt(hidden)`` (float32); ``standardize``:
  ``(x - std_bias) * std_scale``;
- the embedder: RMSNorm without weight, the bias-free projection to the text width.

Matrices keep their stored type (models/vision/stored.py); the attention runs in the type
models/vision/attention_dtype.py picks. gemma4_load.py builds it from a folder or an mmproj.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.layer_progress import layer_done
from radixserve.models.vision.attention_dtype import vision_attention_dtype
from radixserve.models.vision.stored import describe_linear


@dataclass(frozen=True)
class Gemma4VisionConfig:
    """The tower's shape (``vision_config`` / the mmproj's ``clip.vision.*`` and tensors)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    pooling_kernel_size: int
    position_embedding_size: int  # rows of each of the x and y tables
    text_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100.0
    standardize: bool = False

    @property
    def patch_dim(self) -> int:
        return 3 * self.patch_size ** 2


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma 4's RMSNorm over the last dimension, in float32: ``x * (mean(x²) + eps)^-0.5``,
    times ``weight`` (float32) where given; returned in ``x``'s dtype."""
    x32 = x.float()
    out = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        out = out * weight
    return out.to(x.dtype)


class ClippedLinear(nn.Module):
    """``Gemma4ClippableLinear``: the input clamped to [input_min, input_max], the linear, the
    output clamped to [output_min, output_max] (bounds as stored, infinite ones no clamp)."""

    def __init__(self, linear: nn.Module, bounds: tuple[float, float, float, float]) -> None:
        super().__init__()
        self.linear = linear
        self.input_min, self.input_max, self.output_min, self.output_max = bounds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(self.input_min, self.input_max)
        return self.linear(x).clamp(self.output_min, self.output_max)


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t`` [..., head_dim] turned in float32: each half of the head is its own neox rotary
    (``rotate_half`` within the half), ``cos``/``sin`` [S, head_dim] laid out to match."""
    t32 = t.float()
    halves = []
    for part in t32.chunk(2, dim=-1):
        a, b = part.chunk(2, dim=-1)
        halves.append(torch.cat((-b, a), dim=-1))
    return t32 * cos + torch.cat(halves, dim=-1) * sin


class Gemma4VisionLayer(nn.Module):
    def __init__(self, config: Gemma4VisionConfig, parts, prefix: str) -> None:
        super().__init__()
        dim, inner, hd = config.hidden_size, config.intermediate_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_heads,
                                                            config.num_kv_heads, hd)
        self.eps = config.rms_norm_eps
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        self.q_proj = parts.linear(f"{attn}.q_proj", config.num_heads * hd, dim)
        self.k_proj = parts.linear(f"{attn}.k_proj", config.num_kv_heads * hd, dim)
        self.v_proj = parts.linear(f"{attn}.v_proj", config.num_kv_heads * hd, dim)
        self.o_proj = parts.linear(f"{attn}.o_proj", dim, config.num_heads * hd)
        self.q_norm = parts.norm(f"{attn}.q_norm", hd)
        self.k_norm = parts.norm(f"{attn}.k_norm", hd)
        self.gate_proj = parts.linear(f"{mlp}.gate_proj", inner, dim)
        self.up_proj = parts.linear(f"{mlp}.up_proj", inner, dim)
        self.down_proj = parts.linear(f"{mlp}.down_proj", dim, inner)
        self.norms = {name: parts.norm(f"{prefix}.{name}", dim) for name in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
            "post_feedforward_layernorm")}
        self.compute_dtype: torch.dtype | None = None  # the attention's (attention_dtype.py)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` [n, S, D] (n images of S patches) → [n, S, D]; each image attends within
        itself. ``cos``/``sin`` [S, head_dim] float32."""
        n, num_patches, dim = x.shape
        rows = x.reshape(-1, dim)

        def heads(proj: nn.Module, count: int) -> torch.Tensor:
            return proj(rows).view(n, num_patches, count, self.head_dim)

        q = _rotate(rms_norm(heads(self.q_proj, self.num_heads), self.q_norm, self.eps),
                    cos[:, None], sin[:, None])
        k = _rotate(rms_norm(heads(self.k_proj, self.num_kv_heads), self.k_norm, self.eps),
                    cos[:, None], sin[:, None])
        v = rms_norm(heads(self.v_proj, self.num_kv_heads), None, self.eps)
        work = self.compute_dtype or x.dtype
        q, k, v = (t.transpose(1, 2).to(work) for t in (q, k, v))  # [n, heads, S, hd]
        if self.num_kv_heads != self.num_heads:
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0)  # q, k are RMS-normed
        out = out.to(x.dtype).transpose(1, 2).reshape(-1, self.num_heads * self.head_dim)
        return self.o_proj(out).view(n, num_patches, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        norm = self.norms
        h = self.attention(rms_norm(x, norm["input_layernorm"], self.eps), cos, sin)
        x = x + rms_norm(h, norm["post_attention_layernorm"], self.eps)
        h = rms_norm(x, norm["pre_feedforward_layernorm"], self.eps).reshape(-1, x.shape[-1])
        h = self.down_proj(F.gelu(self.gate_proj(h), approximate="tanh") * self.up_proj(h))
        return x + rms_norm(h.view(x.shape), norm["post_feedforward_layernorm"], self.eps)


class Gemma4VisionEncoder(nn.Module):
    """``forward(pixels [n, ph, pw, patch_dim] float32)`` → [n, ph * pw / k², text hidden]
    float32 for ``n`` images of one shape (`VisionEncoder`, models/vision/__init__.py);
    ``parts`` gives the weights by transformers' names under ``model.vision_tower.`` and
    ``model.`` for ``embed_vision.`` (gemma4_load.py)."""

    def __init__(self, config: Gemma4VisionConfig, parts, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if config.head_dim % 4:
            raise ValueError(f"vision head dim {config.head_dim} is not a multiple of 4 "
                             f"(2-D rotary over halves)")
        if config.num_heads % config.num_kv_heads:
            raise ValueError(f"{config.num_heads} vision heads do not share "
                             f"{config.num_kv_heads} KV heads evenly")
        self.config, self.dtype, self.device = config, dtype, device
        dim = config.hidden_size
        self.input_proj = parts.linear("patch_embedder.input_proj", dim, config.patch_dim,
                                       clippable=False)
        self.position_table = parts.tensor("patch_embedder.position_embedding_table",
                                           (2, config.position_embedding_size, dim))
        self.layers = nn.ModuleList(Gemma4VisionLayer(config, parts, f"encoder.layers.{i}")
                                    for i in range(config.num_layers))
        self.std_bias = self.std_scale = None
        if config.standardize:
            self.std_bias = parts.tensor("std_bias", (dim,))
            self.std_scale = parts.tensor("std_scale", (dim,))
        self.projection = parts.linear("embed_vision.embedding_projection",
                                       config.text_hidden_size, dim, clippable=False)
        self.hidden_size = config.text_hidden_size
        quarter = torch.arange(0, config.head_dim // 2, 2, dtype=torch.float)
        self.inv_freq = 1.0 / config.rope_theta ** (quarter / (config.head_dim // 2))
        self.attention_dtype, self.attention_why = vision_attention_dtype(device, dtype)
        for layer in self.layers:
            layer.compute_dtype = self.attention_dtype

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        """`VisionEncoder.tokens_for`: ``shape`` [ph, pw, patch_dim] with ph and pw whole
        pooling blocks and within the position table, ``grid`` empty (1-D text rope)."""
        cfg = self.config
        k, dim, side = cfg.pooling_kernel_size, cfg.patch_dim, cfg.position_embedding_size
        shape = [int(s) for s in shape]
        if len(shape) != 3 or shape[2] != dim or min(shape[:2]) < 1:
            raise ValueError(f"pixels of shape {shape}; this model's encoder takes "
                             f"[ph, pw, {dim}] patch rows")
        if list(grid):
            raise ValueError(f"token grid {list(grid)} given; Gemma 4 images take none")
        ph, pw = shape[:2]
        if ph % k or pw % k:
            raise ValueError(f"a patch grid of {ph} x {pw} is not whole {k} x {k} pooling "
                             f"blocks")
        if max(ph, pw) > side:
            raise ValueError(f"a patch grid of {ph} x {pw} exceeds the {side} positions of "
                             f"the vision position table")
        return ph * pw // k ** 2

    def _positions(self, ph: int, pw: int) -> tuple[torch.Tensor, ...]:
        """(the position rows [ph * pw, D], rotary cos and sin [ph * pw, head_dim] float32)
        of the patches in row-major order (x = column, y = row)."""
        y = torch.arange(ph).repeat_interleave(pw)
        x = torch.arange(pw).repeat(ph)
        table = self.position_table
        pos = table[0][x.to(self.device)] + table[1][y.to(self.device)]
        fx, fy = x[:, None] * self.inv_freq, y[:, None] * self.inv_freq
        freqs = torch.cat((fx, fx, fy, fy), dim=-1).to(self.device)
        return pos, freqs.cos(), freqs.sin()

    def _pool(self, x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
        """[n, ph * pw, D] → [n, ph / k * pw / k, D] float32: each k x k block's mean, the
        blocks row-major, times sqrt(D)."""
        n, _, dim = x.shape
        k = self.config.pooling_kernel_size
        blocks = x.float().view(n, ph // k, k, pw // k, k, dim).mean(dim=(2, 4))
        return blocks.reshape(n, -1, dim) * math.sqrt(dim)

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        n, ph, pw, dim = pixels.shape
        self.tokens_for(list(pixels.shape[1:]), [])
        pos, cos, sin = self._positions(ph, pw)
        rows = pixels.to(device=self.device, dtype=torch.float32).reshape(-1, dim)
        x = self.input_proj((2 * (rows - 0.5)).to(self.dtype)).view(n, ph * pw, -1)
        x = x + pos.to(self.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
            layer_done()  # a long encode is progress, not a hang (layers/layer_progress.py)
        pooled = self._pool(x, ph, pw)
        if self.std_bias is not None:
            pooled = (pooled - self.std_bias) * self.std_scale
        normed = rms_norm(pooled, None, self.config.rms_norm_eps).to(self.dtype)
        out = self.projection(normed.reshape(-1, normed.shape[-1]))
        return out.view(n, -1, self.hidden_size).float()

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.config
        clipped = any(isinstance(m, ClippedLinear) for m in self.modules())
        return (f"gemma4: ViT {cfg.num_layers} layers (hidden {cfg.hidden_size}, "
                f"{cfg.num_heads} heads of {cfg.head_dim}{', clipped linears' if clipped else ''}"
                f"), patches of {cfg.patch_size}px, {cfg.pooling_kernel_size}x"
                f"{cfg.pooling_kernel_size} patches a token -> {self.hidden_size}; matrices "
                f"{', '.join(kinds)}; attention {str(self.attention_dtype)[6:]} "
                f"({self.attention_why})")
