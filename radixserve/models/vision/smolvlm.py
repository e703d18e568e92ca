"""SmolVLM's vision encoder (Idefics3 layout): the SigLIP tower, then the connector.

One encoder input is one TILE of the processor's split ([3, S, S], S = the tower's image size;
the API process makes each tile its own image, multimodal/): the tower gives its
(S / patch)² patch states, the connector's pixel shuffle folds every ``scale_factor`` x
``scale_factor`` block of neighbouring patches into one row of ``scale_factor²`` times the
width (transformers' ``SmolVLMConnector.pixel_shuffle``), and the bias-free
``modality_projection`` maps each row to the text width: ``tokens_per_image`` =
(S / patch / scale_factor)² rows a tile.

SmolVLM's tower takes the position of a patch from a bucketed fractional grid (NaViT, for
images of any size); a full tile's ids are computed once here the way transformers computes
them (float32 ``bucketize``), so the learned table is indexed exactly as there.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision.fixed_shape import FixedShape
from radixserve.models.vision.siglip import SiglipConfig, SiglipVisionTower
from radixserve.models.vision.stored import describe_linear, make_linear

PROJECTION = "connector.modality_projection.proj.weight"


def full_tile_position_ids(patches_per_side: int) -> torch.Tensor:
    """The position-table rows of a tile whose every patch is real, row-major: transformers'
    ``SmolVLMVisionEmbeddings`` arithmetic (float32 steps bucketed by ``right=True``), which
    need not be 0..n²-1 where float rounding moves a patch across a boundary."""
    n = patches_per_side
    boundaries = torch.arange(1 / n, 1.0, 1 / n)
    coords = torch.arange(n, dtype=torch.float32) * (1.0 / torch.tensor(float(n)))
    buckets = torch.bucketize(coords.clamp(max=1.0 - 1e-6), boundaries, right=True)
    return (buckets[:, None] * n + buckets[None, :]).reshape(-1)


class SmolVLMConnector(nn.Module):
    """[n, P, vision_hidden] → [n, P / scale², text_hidden] in float32."""

    def __init__(self, config: SiglipConfig, scale_factor: int, weights,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        side = config.patches_per_side
        if scale_factor < 1 or side % scale_factor:
            raise ValueError(f"scale factor {scale_factor} does not divide the {side} x {side} "
                             "patch grid")
        self.scale, self.side = scale_factor, side
        projection = weights.matrix(PROJECTION)
        if projection.k != config.hidden_size * scale_factor ** 2:
            raise ValueError(f"the modality projection takes {projection.k} features; the tower "
                             f"gives {config.hidden_size} x {scale_factor}²")
        self.projection = make_linear(projection, None, device, dtype)

    def pixel_shuffle(self, x: torch.Tensor) -> torch.Tensor:
        """[n, side², D] → [n, (side/s)², D s²]: row (i, j) of the output holds the patches
        (i s + a, j s + b) for a, b < s, ordered by a then b, each D wide."""
        n, _, dim = x.shape
        s, side = self.scale, self.side
        grid = x.reshape(n, side // s, s, side // s, s, dim)  # [n, i, a, j, b, D]
        return grid.permute(0, 1, 3, 2, 4, 5).reshape(n, (side // s) ** 2, s * s * dim)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        rows = self.pixel_shuffle(states)
        n, tokens, width = rows.shape
        return self.projection(rows.reshape(n * tokens, width)).view(n, tokens, -1).float()


class SmolVLMVisionEncoder(FixedShape, nn.Module):
    """``forward(tiles [n, 3, S, S] float32)`` → [n, tokens_per_image, text_hidden] float32.
    ``image_shape`` is one tile's [C, S, S], ``hidden_size`` the text model's (the caller checks
    they match); models/vision/load.py builds it."""

    def __init__(self, config: SiglipConfig, scale_factor: int, weights,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.image_shape = [config.num_channels, config.image_size, config.image_size]
        self.tower = SiglipVisionTower(config, weights, device, dtype)
        ids = full_tile_position_ids(config.patches_per_side).to(device)
        table = self.tower.position_embedding
        self.tower.position_embedding = nn.Parameter(table[ids], requires_grad=False)
        self.connector = SmolVLMConnector(config, scale_factor, weights, device, dtype)
        self.tokens_per_image = config.num_patches // scale_factor ** 2
        self.hidden_size = self.connector.projection.out_features

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if list(pixels.shape[1:]) != self.image_shape:
            raise ValueError(f"tiles of shape {list(pixels.shape[1:])}, the encoder takes "
                             f"{self.image_shape}")
        return self.connector(self.tower(pixels))

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.tower.config
        return (f"smolvlm: SigLIP {cfg.num_layers} layers (hidden {cfg.hidden_size}, "
                f"{cfg.num_patches} patches of {cfg.patch_size}px), pixel shuffle x"
                f"{self.connector.scale}: {self.tokens_per_image} tokens per {cfg.image_size}px "
                f"tile -> {self.hidden_size}; matrices {', '.join(kinds)}; attention "
                f"{str(self.tower.attention_dtype)[6:]} ({self.tower.attention_why})")
