"""Mistral 3's vision encoder: the Pixtral ViT and the Mistral 3 multi-modal projector
(transformers' ``PixtralVisionModel`` + ``Mistral3MultiModalProjector``; the rows of
``Mistral3Model.get_image_features``).

Input (the `VisionEncoder` contract, models/vision/__init__.py): ``n`` images of one shape
``[3, H, W]``, H and W multiples of ``patch * merge``; the token grid is
``(1, H / (patch * merge), W / (patch * merge))``. Per image:

1. patches: the bias-free Conv2d of stride ``patch`` as one linear over each (C, P, P) patch;
   ``ln_pre`` RMSNorm;
2. 2-D rotary over the whole head: a patch's row turns the first quarter of the head's
   frequencies with the even-numbered inverse frequencies, its column the second quarter with
   the odd-numbered ones, both halves of the head alike (transformers'
   ``PixtralVisionRotaryEmbedding``); at most ``image_size / patch`` patches a side;
3. blocks (RMSNorm → attention, q/k/v/o without bias → RMSNorm → gated MLP), each image
   attending only within itself;
4. the projector: RMSNorm, each 2 x 2 block of patches as one row (``torch.nn.functional.unfold``'s
   order: channel-major, then the block's row, then its column), the merging linear, then
   Linear → GELU → Linear to the text width; rows in row-major token order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.layer_progress import layer_done
from radixserve.models.vision.attention_dtype import vision_attention_dtype
from radixserve.models.vision.qwen2_5_vl import RMSNorm
from radixserve.models.vision.stored import describe_linear, make_linear

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}  # the tower's MLP (transformers' ACT2FN names)


@dataclass(frozen=True)
class PixtralConfig:
    """The tower's and projector's shape (config.json / mmproj ``clip.vision.*``)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int  # blocks run: the feature layer's (all of them in the releases)
    num_heads: int
    text_hidden_size: int
    image_size: int  # the rope's extent: image_size / patch_size patches a side at most
    patch_size: int = 14
    merge_size: int = 2
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5  # the tower's RMSNorms (transformers hard-codes 1e-5)
    projector_norm_eps: float = 1e-5  # the projector's (the text model's rms_norm_eps)
    num_channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_patches_per_side(self) -> int:
        return self.image_size // self.patch_size


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PixtralBlock(nn.Module):
    def __init__(self, cfg: PixtralConfig, weights, prefix: str, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        dim, inner = cfg.hidden_size, cfg.intermediate_size

        def linear(name: str, n: int, k: int) -> nn.Module:
            m = weights.matrix(f"{prefix}.{name}.weight")
            if (m.n, m.k) != (n, k):
                raise ValueError(f"vision weight {prefix}.{name}.weight of shape {(m.n, m.k)}, "
                                 f"expected {(n, k)}")
            return make_linear(m, None, device, dtype)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights.tensor(f"{prefix}.{name}.weight").to(device, dtype),
                           cfg.norm_eps)

        self.num_heads, self.act = cfg.num_heads, ACTIVATIONS[cfg.hidden_act]
        self.attention_norm, self.ffn_norm = norm("attention_norm"), norm("ffn_norm")
        self.q, self.k, self.v, self.o = (linear(f"attention.{p}_proj", dim, dim)
                                          for p in "qkvo")
        self.gate = linear("feed_forward.gate_proj", inner, dim)
        self.up = linear("feed_forward.up_proj", inner, dim)
        self.down = linear("feed_forward.down_proj", dim, inner)
        self.compute_dtype: torch.dtype | None = None  # the attention's (attention_dtype.py)

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` [n, S, D] → the attention's output [n, S, D]; each image's S patches see
        only each other (one batch entry per image)."""
        n, seq, dim = x.shape
        flat = x.reshape(n * seq, dim)
        q, k, v = (p(flat).view(n, seq, self.num_heads, -1).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        # rope in float32 (cos, sin [S, head_dim]), as transformers runs a float32 tower
        q, k = ((t.float() * cos + _rotate_half(t.float()) * sin) for t in (q, k))
        dtype = self.compute_dtype or x.dtype
        out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype))
        out = out.transpose(1, 2).reshape(n * seq, dim).to(x.dtype)
        return self.o(out).view(n, seq, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        flat = h.reshape(-1, h.shape[-1])
        h = self.down(self.act(self.gate(flat)) * self.up(flat))
        return x + h.view(x.shape)


class PixtralVisionEncoder(nn.Module):
    """``forward(pixels [n, 3, H, W] float32)`` → [n, rows * cols, text hidden] float32;
    models/vision/pixtral_load.py builds it from a folder or an mmproj. ``weights`` answers
    the release names under ``vision_tower.`` and ``multi_modal_projector.``."""

    deepstack_layers = 0  # `VisionEncoder`: no rows beside the main ones

    def __init__(self, cfg: PixtralConfig, weights, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if cfg.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision hidden_act {cfg.hidden_act!r} is not supported; "
                             f"supported: {sorted(ACTIVATIONS)}")
        self.config, self.dtype, self.device = cfg, dtype, device
        self.hidden_size = cfg.text_hidden_size
        self.patch_embed = self._linear(weights, "vision_tower.patch_conv.weight",
                                        cfg.hidden_size,
                                        cfg.num_channels * cfg.patch_size ** 2, None)
        self.ln_pre = RMSNorm(weights.tensor("vision_tower.ln_pre.weight").to(device, dtype),
                              cfg.norm_eps)
        self.blocks = nn.ModuleList(
            PixtralBlock(cfg, weights, f"vision_tower.transformer.layers.{i}", device, dtype)
            for i in range(cfg.num_layers))
        p, wide = "multi_modal_projector.", cfg.hidden_size * cfg.merge_size ** 2
        self.norm = RMSNorm(weights.tensor(f"{p}norm.weight").to(device, dtype),
                            cfg.projector_norm_eps)
        self.merging = self._linear(weights, f"{p}patch_merger.merging_layer.weight",
                                    cfg.hidden_size, wide, None)
        self.linear_1 = self._linear(weights, f"{p}linear_1.weight", cfg.text_hidden_size,
                                     cfg.hidden_size, f"{p}linear_1.bias")
        self.linear_2 = self._linear(weights, f"{p}linear_2.weight", cfg.text_hidden_size,
                                     cfg.text_hidden_size, f"{p}linear_2.bias")
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32)
                                       / cfg.head_dim)
        # rows turn the even-numbered frequencies, columns the odd-numbered ones
        self.register_buffer("inv_rows", inv[0::2].to(device), persistent=False)
        self.register_buffer("inv_cols", inv[1::2].to(device), persistent=False)
        self.attention_dtype, self.attention_why = vision_attention_dtype(device, dtype)
        for block in self.blocks:
            block.compute_dtype = self.attention_dtype
        self._ropes: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _linear(self, weights, name: str, n: int, k: int, bias: str | None) -> nn.Module:
        m = weights.matrix(name)
        if (m.n, m.k) != (n, k):
            raise ValueError(f"vision weight {name} of shape {(m.n, m.k)}, expected {(n, k)}")
        b = weights.tensor(bias) if bias is not None and weights.has(bias) else None
        return make_linear(m, b, self.device, self.dtype)

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        """`VisionEncoder.tokens_for`: ``shape`` [3, H, W] with H and W multiples of
        ``patch * merge`` and at most ``image_size`` rounded down to patches, ``grid``
        [1, H / (patch * merge), W / (patch * merge)]; ValueError otherwise."""
        cfg = self.config
        step = cfg.patch_size * cfg.merge_size
        shape, grid = [int(s) for s in shape], [int(g) for g in grid]
        if len(shape) != 3 or shape[0] != cfg.num_channels or min(shape) < 1:
            raise ValueError(f"pixels of shape {shape}; this model's encoder takes "
                             f"[{cfg.num_channels}, H, W]")
        if shape[1] % step or shape[2] % step:
            raise ValueError(f"an image of {shape[1]} x {shape[2]} px is not a multiple of "
                             f"{step} px (patch {cfg.patch_size} x merge {cfg.merge_size})")
        side = max(shape[1], shape[2]) // cfg.patch_size
        if side > cfg.max_patches_per_side:
            raise ValueError(f"an image of {shape[1]} x {shape[2]} px has {side} patches a "
                             f"side; the rope covers {cfg.max_patches_per_side}")
        expected = [1, shape[1] // step, shape[2] // step]
        if grid != expected:
            raise ValueError(f"token grid {grid} for pixels of shape {shape}; expected "
                             f"{expected}")
        return expected[1] * expected[2]

    def _rope(self, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows * cols, head_dim] float32 of a patch grid, row-major."""
        key = (rows, cols)
        if key not in self._ropes:
            if len(self._ropes) > 64:  # image sizes vary: keep the recent ones
                self._ropes.pop(next(iter(self._ropes)))
            r, c = torch.meshgrid(torch.arange(rows, device=self.device),
                                  torch.arange(cols, device=self.device), indexing="ij")
            angles = torch.cat([r.reshape(-1, 1) * self.inv_rows,
                                c.reshape(-1, 1) * self.inv_cols], dim=-1)
            angles = torch.cat([angles, angles], dim=-1)
            self._ropes[key] = (angles.cos(), angles.sin())
        return self._ropes[key]

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        cfg, step = self.config, self.config.patch_size * self.config.merge_size
        n, c, h, w = pixels.shape
        self.tokens_for([c, h, w], [1, h // step, w // step])
        p, gh, gw = cfg.patch_size, h // cfg.patch_size, w // cfg.patch_size
        # [n, C, gh, P, gw, P] → one (C, P, P) row per patch, patches row-major
        rows = pixels.to(self.dtype).reshape(n, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
        x = self.patch_embed(rows.reshape(n * gh * gw, c * p * p)).view(n, gh * gw, -1)
        x = self.ln_pre(x)
        cos, sin = self._rope(gh, gw)
        for block in self.blocks:
            x = block(x, cos, sin)
            layer_done()  # a long encode is progress, not a hang (layers/layer_progress.py)
        x = self.norm(x)
        m = cfg.merge_size
        # unfold's order within a merged row: channel, then the block's row, then its column
        x = x.view(n, gh // m, m, gw // m, m, -1).permute(0, 1, 3, 5, 2, 4)
        tokens = (gh // m) * (gw // m)
        x = self.merging(x.reshape(n * tokens, -1))
        out = self.linear_2(F.gelu(self.linear_1(x)))
        return out.view(n, tokens, -1).float()

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.config
        return (f"pixtral: ViT {cfg.num_layers} blocks (hidden {cfg.hidden_size}, "
                f"{cfg.hidden_act}), patches of {cfg.patch_size}px up to "
                f"{cfg.max_patches_per_side} a side, {cfg.merge_size}x{cfg.merge_size} merged "
                f"-> {self.hidden_size}; matrices {', '.join(kinds)}; attention "
                f"{str(self.attention_dtype)[6:]} ({self.attention_why})")
