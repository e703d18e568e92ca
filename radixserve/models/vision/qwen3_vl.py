"""The Qwen3-VL ViT (transformers' ``Qwen3VLVisionModel``; Qwen3.5's ``Qwen3_5VisionModel`` is
the same without deepstack): a grid of patches → the text model's image rows.

An image is the processor's pixels ``[t, h, w, C * T * P * P]`` (multimodal/qwen_vl.py: the
``t * h * w`` patch rows of transformers' ``pixel_values`` in its order, each frame's rows
grouped by merge window: ``merge`` x ``merge`` neighbours consecutive). Then, per frame:

- the Conv3d patch embedding (kernel = stride = ``T x P x P``) as one linear with bias over
  each row (the kernel flattened as (C, T, P, P), the rows' order);
- plus the learned ``side x side`` position table resampled to the frame's ``h x w`` grid
  (bilinear, align_corners, as transformers' ``fast_pos_embed_interpolate``);
- ``num_layers`` pre-norm blocks: LayerNorm → attention (fused qkv with bias, 2-D rotary:
  the first half of each head's frequencies turn by the patch's row, the second by its
  column; every patch of a frame attends to every other) → proj; LayerNorm → fc1 / GELU-tanh
  / fc2;
- the merger: LayerNorm, each merge window's ``merge²`` rows side by side, fc1, GELU, fc2 to
  the text width: ``t * h * w / merge²`` rows;
- Qwen3-VL's deepstack: after each block named in ``deepstack_indexes`` a merger of its own
  (the windows side by side first, then its LayerNorm: "postshuffle") makes ``k`` more sets of
  rows of the text width, which the text model adds to its hidden states at the image's
  positions after its decoder layers 0 .. k-1. They travel beside the main rows: ``forward``
  gives ``[n, tokens, text hidden * (1 + k)]``, the main merger's first (llama.cpp's mmproj
  layout).

Matrices keep their stored type (models/vision/stored.py); the attention runs in the type
models/vision/attention_dtype.py picks. qwen3_vl_load.py builds it from a folder or an mmproj.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.layer_progress import layer_done
from radixserve.models.vision.attention_dtype import vision_attention_dtype
from radixserve.models.vision.stored import describe_linear

_ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}  # the blocks' MLP


@dataclass(frozen=True)
class Qwen3VLConfig:
    """The tower's shape (``vision_config`` / the mmproj's ``clip.vision.*``)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    num_position_embeddings: int  # a square: side x side
    out_hidden_size: int  # the text model's width
    in_channels: int = 3
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    deepstack_indexes: tuple[int, ...] = ()  # Qwen3-VL: blocks whose output a merger takes

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def grid_side(self) -> int:
        return round(self.num_position_embeddings ** 0.5)


def block_order(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of each of a frame's ``h * w`` patches in the processor's order (merge
    windows consecutive, row-major within each and across them)."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    return (rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1))


def _taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two table entries and weights of each ``index`` on an axis of ``size`` patches
    resampled from ``side`` entries (bilinear, align_corners: the ends meet the ends)."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    taps = (floor.long()[:, None] + torch.arange(2)).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - torch.arange(2)).abs()).clamp(min=0)
    return taps, weights


class Qwen3VLBlock(nn.Module):
    def __init__(self, config: Qwen3VLConfig, parts, prefix: str) -> None:
        super().__init__()
        dim, inner = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_heads
        self.norm1 = parts.layer_norm(f"{prefix}.norm1", config.layer_norm_eps)
        self.qkv = parts.linear(f"{prefix}.attn.qkv", 3 * dim, dim)
        self.proj = parts.linear(f"{prefix}.attn.proj", dim, dim)
        self.norm2 = parts.layer_norm(f"{prefix}.norm2", config.layer_norm_eps)
        self.fc1 = parts.linear(f"{prefix}.mlp.linear_fc1", inner, dim)
        self.fc2 = parts.linear(f"{prefix}.mlp.linear_fc2", dim, inner)
        self.approximate = _ACTIVATIONS[config.hidden_act]
        self.compute_dtype: torch.dtype | None = None  # the attention's (attention_dtype.py)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` [F, S, D] (F frames of S patches) → [F, S, D]; each frame attends within
        itself. ``cos``/``sin`` [1, 1, S, head_dim] float32 (q and k turn in float32)."""
        frames, num_patches, dim = x.shape
        qkv = self.qkv(x.reshape(-1, dim)).view(frames, num_patches, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [F, heads, S, head_dim] each

        def rotate(t: torch.Tensor) -> torch.Tensor:
            t32 = t.float()
            half = t32.shape[-1] // 2
            turned = torch.cat((-t32[..., half:], t32[..., :half]), dim=-1)
            return t32 * cos + turned * sin

        q, k = rotate(q), rotate(k)
        work = self.compute_dtype or x.dtype
        out = F.scaled_dot_product_attention(q.to(work), k.to(work), v.to(work))
        out = out.to(x.dtype).transpose(1, 2).reshape(-1, dim)
        return self.proj(out).view(frames, num_patches, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), cos, sin)
        h = self.fc1(self.norm2(x).reshape(-1, x.shape[-1]))
        h = self.fc2(F.gelu(h, approximate=self.approximate))
        return x + h.view(x.shape)


class Qwen3VLMerger(nn.Module):
    """LayerNorm, each merge window's ``merge²`` rows side by side, fc1, GELU, fc2: [rows, D]
    → [rows / merge², text hidden]. ``postshuffle`` (the deepstack mergers): the LayerNorm
    over the side-by-side rows instead of over each row."""

    def __init__(self, config: Qwen3VLConfig, parts, prefix: str, postshuffle: bool) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.merge_size ** 2
        self.postshuffle = postshuffle
        self.norm = parts.layer_norm(f"{prefix}.norm", config.layer_norm_eps)
        width = self.merged if postshuffle else config.hidden_size
        if self.norm.weight.shape[0] != width:
            raise ValueError(f"vision weight {prefix}.norm.weight of width "
                             f"{self.norm.weight.shape[0]}, expected {width}")
        self.fc1 = parts.linear(f"{prefix}.linear_fc1", self.merged, self.merged)
        self.fc2 = parts.linear(f"{prefix}.linear_fc2", config.out_hidden_size, self.merged)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle:
            merged = self.norm(x.reshape(-1, self.merged))
        else:
            merged = self.norm(x).reshape(-1, self.merged)
        return self.fc2(F.gelu(self.fc1(merged)))


class Qwen3VLVisionEncoder(nn.Module):
    """``forward(pixels [n, t, h, w, patch_dim] float32)`` → [n, t * h * w / merge², text
    hidden * (1 + deepstack_layers)] float32 for ``n`` images of one shape (`VisionEncoder`,
    models/vision/__init__.py; the main rows first, then each deepstack merger's in
    ``deepstack_indexes`` order); ``hidden_size`` is the text width. ``parts`` gives the weights
    by transformers' names under ``visual.`` (qwen3_vl_load.py)."""

    def __init__(self, config: Qwen3VLConfig, parts, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"vision activation {config.hidden_act!r}; supported: "
                             f"{sorted(_ACTIVATIONS)}")
        if config.grid_side ** 2 != config.num_position_embeddings:
            raise ValueError(f"{config.num_position_embeddings} position embeddings are not "
                             f"a square grid")
        indexes = config.deepstack_indexes
        if len(set(indexes)) != len(indexes) or not all(0 <= i < config.num_layers
                                                        for i in indexes):
            raise ValueError(f"deepstack layers {list(indexes)} are not distinct blocks of "
                             f"the {config.num_layers}")
        self.config, self.dtype, self.device = config, dtype, device
        dim = config.hidden_size
        self.patch_embed = parts.linear("patch_embed.proj", dim, config.patch_dim)
        self.pos_embed = parts.tensor("pos_embed.weight")
        if tuple(self.pos_embed.shape) != (config.num_position_embeddings, dim):
            raise ValueError(f"vision position embedding of shape "
                             f"{tuple(self.pos_embed.shape)}, expected "
                             f"{(config.num_position_embeddings, dim)}")
        self.blocks = nn.ModuleList(Qwen3VLBlock(config, parts, f"blocks.{i}")
                                    for i in range(config.num_layers))
        self.merger = Qwen3VLMerger(config, parts, "merger", postshuffle=False)
        self.deepstack_mergers = nn.ModuleList(
            Qwen3VLMerger(config, parts, f"deepstack_merger_list.{i}", postshuffle=True)
            for i in range(len(indexes)))
        self.hidden_size = config.out_hidden_size
        self.deepstack_layers = len(indexes)
        head_dim = dim // config.num_heads
        quarter = torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)
        self.inv_freq = 1.0 / (config.rope_theta ** quarter)  # head_dim / 4 frequencies
        self.attention_dtype, self.attention_why = vision_attention_dtype(device, dtype)
        for block in self.blocks:
            block.compute_dtype = self.attention_dtype

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        """`VisionEncoder.tokens_for`: ``shape`` [t, h, w, patch_dim] with h and w whole merge
        windows, ``grid`` [t, h / merge, w / merge]."""
        merge, dim = self.config.merge_size, self.config.patch_dim
        shape, grid = [int(s) for s in shape], [int(g) for g in grid]
        if len(shape) != 4 or shape[3] != dim or min(shape[:3]) < 1:
            raise ValueError(f"pixels of shape {shape}; this model's encoder takes "
                             f"[t, h, w, {dim}] patch rows")
        t, h, w = shape[:3]
        if h % merge or w % merge:
            raise ValueError(f"a patch grid of {h} x {w} is not whole {merge} x {merge} "
                             f"merge windows")
        if grid != [t, h // merge, w // merge]:
            raise ValueError(f"token grid {grid} does not match pixels of shape {shape} "
                             f"(expected {[t, h // merge, w // merge]})")
        return t * h * w // merge ** 2

    def _positions(self, h: int, w: int) -> tuple[torch.Tensor, ...]:
        """(the resampled position embeddings [h * w, D], rotary cos and sin [h * w,
        head_dim]) of a frame's patches in the processor's order."""
        rows, cols = block_order(h, w, self.config.merge_size)
        side = self.config.grid_side
        (row_taps, row_w), (col_taps, col_w) = _taps(rows, h, side), _taps(cols, w, side)
        index = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
        weight = (row_w[:, :, None] * col_w[:, None, :]).reshape(-1, 4)
        table = self.pos_embed[index.to(self.device)]
        pos = (table * weight.to(self.device, table.dtype)[:, :, None]).sum(1)
        freqs = torch.cat((rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq), -1)
        freqs = torch.cat((freqs, freqs), dim=-1).to(self.device)
        return pos, freqs.cos()[None, None], freqs.sin()[None, None]

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        n, t, h, w, dim = pixels.shape
        self.tokens_for(list(pixels.shape[1:]), [t, h // self.config.merge_size,
                                                 w // self.config.merge_size])
        pos, cos, sin = self._positions(h, w)
        rows = pixels.to(device=self.device, dtype=self.dtype).reshape(-1, dim)
        x = self.patch_embed(rows).view(n * t, h * w, -1) + pos.to(self.dtype)
        deepstack = []
        for index, block in enumerate(self.blocks):
            x = block(x, cos, sin)
            layer_done()  # a long encode is progress, not a hang (layers/layer_progress.py)
            if index in self.config.deepstack_indexes:
                merger = self.deepstack_mergers[self.config.deepstack_indexes.index(index)]
                deepstack.append(merger(x))
        out = torch.cat([self.merger(x), *deepstack], dim=-1)
        return out.view(n, -1, self.hidden_size * (1 + self.deepstack_layers)).float()

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.config
        return (f"qwen3_vl: ViT {cfg.num_layers} layers (hidden {cfg.hidden_size}, "
                f"{cfg.num_heads} heads), patches of {cfg.patch_size}px x "
                f"{cfg.temporal_patch_size} frames, {cfg.merge_size}x{cfg.merge_size} patches a "
                f"token -> {self.hidden_size}{self._deepstack_words()}; matrices "
                f"{', '.join(kinds)}; attention {str(self.attention_dtype)[6:]} "
                f"({self.attention_why})")

    def _deepstack_words(self) -> str:
        if not self.deepstack_layers:
            return ""
        return f" (+ deepstack after blocks {list(self.config.deepstack_indexes)})"
