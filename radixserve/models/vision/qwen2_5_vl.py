"""Qwen2.5-VL's vision encoder: a ViT over 3-D patches with 2-D rotary positions, window
attention in most blocks, and a merger folding 2 x 2 patches into one text-width row.

Input (the `VisionEncoder` contract, models/vision/__init__.py): ``n`` images of one shape
``[gt, gh, gw, C*T*P*P]``: transformers' ``pixel_values`` rows of an image, in its order
(each ``merge x merge`` block of neighbouring patches consecutive, blocks row-major, frames
first); the token grid is ``(gt, gh / merge, gw / merge)``. Per image:

1. patch embed: the Conv3d over (C, T, P, P) as one bias-free linear;
2. 2-D rotary: a patch's (row, column) turn the head's two halves' first and second quarters
   (transformers' ``Qwen2_5_VLVisionRotaryEmbedding``);
3. rows reordered by window (``window_order``): blocks ``window_size / patch / merge`` merged
   tokens a side, row-major, the last ones cut by the grid's edge;
4. ``depth`` blocks (RMSNorm → attention with fused qkv + bias, proj → RMSNorm → SwiGLU MLP
   with biases): those in ``fullatt_layers`` attend over the whole frame, the others within
   their window;
5. the merger: RMSNorm, each ``merge²`` consecutive rows as one, Linear, GELU, Linear to the
   text width; rows put back in token order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.layer_progress import layer_done
from radixserve.models.vision.attention_dtype import vision_attention_dtype
from radixserve.models.vision.qwen_vision_grid import Groups, VisionGrid
from radixserve.models.vision.stored import describe_linear, make_linear


@dataclass(frozen=True)
class Qwen25VisionConfig:
    """The tower's shape (config.json ``vision_config`` / mmproj ``clip.vision.*``)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    out_hidden_size: int
    fullatt_layers: tuple[int, ...]
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    window_size: int = 112  # pixels a window's side
    num_channels: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def patch_dim(self) -> int:
        """One input row's width: C * T * P * P."""
        return self.num_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def window_tokens(self) -> int:
        """Merged tokens a window's side."""
        return max(1, self.window_size // self.patch_size // self.merge_size)


class RMSNorm(nn.Module):
    """transformers' Qwen2_5_VLRMSNorm: float32 statistics, the weight after the cast back."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rope over the whole head (halves swapped), in float32 as transformers does."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    return (h * cos + rotated * sin).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, cfg: Qwen25VisionConfig, weights, prefix: str, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        dim, inner = cfg.hidden_size, cfg.intermediate_size

        def linear(name: str, n: int, k: int) -> nn.Module:
            m = weights.matrix(f"{prefix}.{name}.weight")
            if (m.n, m.k) != (n, k):
                raise ValueError(f"vision weight {prefix}.{name}.weight of shape {(m.n, m.k)}, "
                                 f"expected {(n, k)}")
            return make_linear(m, weights.tensor(f"{prefix}.{name}.bias"), device, dtype)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights.tensor(f"{prefix}.{name}.weight").to(device, dtype),
                           cfg.rms_norm_eps)

        self.num_heads = cfg.num_heads
        self.norm1, self.norm2 = norm("norm1"), norm("norm2")
        self.qkv, self.proj = linear("attn.qkv", 3 * dim, dim), linear("attn.proj", dim, dim)
        self.gate, self.up = linear("mlp.gate_proj", inner, dim), linear("mlp.up_proj", inner, dim)
        self.down = linear("mlp.down_proj", dim, inner)
        self.compute_dtype: torch.dtype | None = None  # the attention's (attention_dtype.py)

    def attend(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               groups: Groups) -> torch.Tensor:
        """``x`` [n, S, D] (window order) → the attention's output [n, S, D]: each row sees
        the rows of its group (its window, or its frame) of its own image."""
        n, seq, dim = x.shape
        q, k, v = self.qkv(x.reshape(n * seq, dim)).view(n, seq, 3, self.num_heads, -1).unbind(2)
        cos, sin = rope  # [S, 1, head_dim]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        dtype = self.compute_dtype or q.dtype
        # [n, S, H, hd] → [n * groups, H, len, hd] (padded where groups differ in length)
        q, k, v = (groups.split(t.to(dtype)).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=groups.mask(n))
        out = groups.join(out.transpose(1, 2), n).to(x.dtype)  # [n, S, H, hd]
        return self.proj(out.reshape(n * seq, dim)).view(n, seq, dim)

    def forward(self, x: torch.Tensor, rope, groups: Groups) -> torch.Tensor:
        x = x + self.attend(self.norm1(x), rope, groups)
        h = self.norm2(x)
        shape = h.shape
        flat = h.reshape(-1, shape[-1])
        h = self.down(F.silu(self.gate(flat)) * self.up(flat))
        return x + h.view(shape)


class Qwen25VisionEncoder(nn.Module):
    """``forward(pixels [n, gt, gh, gw, C*T*P*P] float32)`` → [n, gt*gh*gw / merge², text
    hidden] float32, rows in token order (t, then row, then column of the merged grid);
    models/vision/qwen2_5_vl_load.py builds it from a folder or an mmproj."""

    deepstack_layers = 0  # `VisionEncoder`: no rows beside the main ones (Qwen3-VL has some)

    def __init__(self, cfg: Qwen25VisionConfig, weights, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.dtype, self.device = cfg, dtype, device
        patch = weights.matrix("patch_embed.proj.weight")
        if (patch.n, patch.k) != (cfg.hidden_size, cfg.patch_dim):
            raise ValueError(f"patch embedding of shape {(patch.n, patch.k)}, expected "
                             f"{(cfg.hidden_size, cfg.patch_dim)}")
        self.patch_embed = make_linear(patch, None, device, dtype)
        self.blocks = nn.ModuleList(VisionBlock(cfg, weights, f"blocks.{i}", device, dtype)
                                    for i in range(cfg.num_layers))
        self.ln_q = RMSNorm(weights.tensor("merger.ln_q.weight").to(device, dtype), 1e-6)
        wide = cfg.hidden_size * cfg.merge_size ** 2
        fc1, fc2 = weights.matrix("merger.mlp.0.weight"), weights.matrix("merger.mlp.2.weight")
        if (fc1.n, fc1.k, fc2.n, fc2.k) != (wide, wide, cfg.out_hidden_size, wide):
            raise ValueError(f"merger matrices of shapes {(fc1.n, fc1.k)} and {(fc2.n, fc2.k)}, "
                             f"expected {(wide, wide)} and {(cfg.out_hidden_size, wide)}")
        self.merger = nn.ModuleList(
            make_linear(m, weights.tensor(f"merger.mlp.{i}.bias"), device, dtype)
            for i, m in ((0, fc1), (2, fc2)))
        self.hidden_size = cfg.out_hidden_size
        inv = 1.0 / cfg.rope_theta ** (
            torch.arange(0, cfg.hidden_size // cfg.num_heads // 2, 2, dtype=torch.float32)
            / (cfg.hidden_size // cfg.num_heads // 2))
        self.register_buffer("inv_freq", inv.to(device), persistent=False)
        self.attention_dtype, self.attention_why = vision_attention_dtype(device, dtype)
        for block in self.blocks:
            block.compute_dtype = self.attention_dtype
        self._grids: dict[tuple[int, ...], VisionGrid] = {}

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        """`VisionEncoder.tokens_for`: ``shape`` [gt, gh, gw, C*T*P*P] with gh, gw multiples of
        the merge size, ``grid`` [gt, gh / merge, gw / merge]; ValueError otherwise."""
        cfg, m = self.config, self.config.merge_size
        shape, grid = [int(s) for s in shape], [int(g) for g in grid]
        if len(shape) != 4 or shape[3] != cfg.patch_dim or min(shape) < 1:
            raise ValueError(f"pixels of shape {shape}; this model's encoder takes "
                             f"[t, h, w, {cfg.patch_dim}] (patch rows of C*T*P*P)")
        if shape[1] % m or shape[2] % m:
            raise ValueError(f"a patch grid of {shape[1]} x {shape[2]} does not divide into "
                             f"{m} x {m} blocks")
        expected = [shape[0], shape[1] // m, shape[2] // m]
        if grid != expected:
            raise ValueError(f"token grid {grid} for pixels of shape {shape}; expected "
                             f"{expected}")
        return shape[0] * expected[1] * expected[2]

    def _grid(self, shape: tuple[int, ...]) -> VisionGrid:
        if shape not in self._grids:
            if len(self._grids) > 64:  # image sizes vary: keep the recent ones
                self._grids.pop(next(iter(self._grids)))
            self._grids[shape] = VisionGrid(shape, self.config, self.inv_freq, self.device)
        return self._grids[shape]

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        n, *shape = pixels.shape
        self.tokens_for(shape, [shape[0], shape[1] // self.config.merge_size,
                                shape[2] // self.config.merge_size])
        grid = self._grid(tuple(shape))
        rows = pixels.reshape(n * grid.num_patches, -1).to(self.dtype)
        x = self.patch_embed(rows).view(n, grid.num_patches, -1)
        x = x[:, grid.order]  # window order
        rope = (grid.cos, grid.sin)  # float32: transformers turns q and k in float32
        for i, block in enumerate(self.blocks):
            groups = grid.frames if i in self.config.fullatt_layers else grid.windows
            x = block(x, rope, groups)
            layer_done()  # a long encode is progress, not a hang (layers/layer_progress.py)
        merged = self.ln_q(x).reshape(n * grid.num_tokens, -1)
        out = self.merger[1](F.gelu(self.merger[0](merged)))
        return out.view(n, grid.num_tokens, -1)[:, grid.token_restore].float()

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.config
        return (f"qwen2.5-vl: ViT {cfg.num_layers} blocks (hidden {cfg.hidden_size}, full "
                f"attention in {list(cfg.fullatt_layers)}, windows of {cfg.window_size}px), "
                f"patches of {cfg.patch_size}px, {cfg.merge_size}x{cfg.merge_size} merged -> "
                f"{self.hidden_size}; matrices {', '.join(kinds)}; attention "
                f"{str(self.attention_dtype)[6:]} ({self.attention_why})")
