"""Gemma 3's vision encoder: the SigLIP tower and the multi-modal projector.

The projector (transformers' ``Gemma3MultiModalProjector``) turns the tower's
[n, patches_per_side², vision_hidden] states into ``tokens_per_image`` text embeddings: an
average pool of the patch grid to ``tokens_per_side``² (Gemma 3: 64 x 64 → 16 x 16 = 256),
Gemma's RMSNorm (``x / rms(x) * (1 + w)``, eps the tower's), then the
``mm_input_projection_weight`` [vision_hidden, text_hidden] matmul. llama.cpp's mmproj stores the
norm's multiplier ``1 + w`` already (``mm.soft_emb_norm.weight``) and the projection as it is
(``mm.input_projection.weight``, forced to F16 by the converter); models/vision/weights.py gives
both in the Hugging Face form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision.fixed_shape import FixedShape
from radixserve.models.vision.siglip import SiglipConfig, SiglipVisionTower
from radixserve.models.vision.stored import describe_linear, make_linear


class Gemma3Projector(nn.Module):
    """[n, P, vision_hidden] → [n, tokens_per_image, text_hidden] in float32."""

    def __init__(self, config: SiglipConfig, tokens_per_image: int, weights,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.tokens_per_side = round(tokens_per_image ** 0.5)
        side = config.patches_per_side
        if self.tokens_per_side ** 2 != tokens_per_image or side % self.tokens_per_side:
            raise ValueError(f"{tokens_per_image} tokens per image do not pool a "
                             f"{side} x {side} patch grid")
        self.patches_per_side, self.kernel = side, side // self.tokens_per_side
        self.eps = config.layer_norm_eps
        scale = 1.0 + weights.tensor("multi_modal_projector.mm_soft_emb_norm.weight").float()
        self.register_buffer("norm_scale", scale.to(device))
        # the checkpoint's [vision, text] is x @ W: the linear's rows are its columns
        projection = weights.matrix("multi_modal_projector.mm_input_projection_weight")
        if projection.n != config.hidden_size:
            raise ValueError(f"the projector takes {projection.n} features, the tower gives "
                             f"{config.hidden_size}")
        self.input_projection = make_linear(projection.transposed(), None, device, dtype)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        n, _, dim = states.shape
        grid = states.transpose(1, 2).reshape(n, dim, self.patches_per_side, -1)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_scale
        x = x.to(states.dtype).reshape(n * self.tokens_per_side ** 2, dim)
        return self.input_projection(x).view(n, self.tokens_per_side ** 2, -1).float()


class Gemma3VisionEncoder(FixedShape, nn.Module):
    """``forward(pixels [n, 3, H, W] float32)`` → [n, tokens_per_image, text_hidden] float32.
    ``image_shape`` is the [C, H, W] the processor must give, ``hidden_size`` the text model's
    (the caller checks they match); models/vision/load.py builds it."""

    def __init__(self, config: SiglipConfig, tokens_per_image: int, weights,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.tokens_per_image = tokens_per_image
        self.image_shape = [config.num_channels, config.image_size, config.image_size]
        self.tower = SiglipVisionTower(config, weights, device, dtype)
        self.projector = Gemma3Projector(config, tokens_per_image, weights, device, dtype)
        self.hidden_size = self.projector.input_projection.out_features

    @torch.no_grad()  # not inference_mode: callers keep and splice the rows later
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if list(pixels.shape[1:]) != self.image_shape:
            raise ValueError(f"images of shape {list(pixels.shape[1:])}, the encoder takes "
                             f"{self.image_shape}")
        return self.projector(self.tower(pixels))

    def describe(self) -> str:
        """One line for the load's log: the tower's shape and how its matrices are held."""
        kinds = sorted({describe_linear(m) for m in self.modules()
                        if isinstance(m, (nn.Linear, BlockLinear))})
        cfg = self.tower.config
        return (f"gemma3: SigLIP {cfg.num_layers} layers (hidden {cfg.hidden_size}, "
                f"{cfg.num_patches} patches of {cfg.patch_size}px), {self.tokens_per_image} "
                f"tokens per {cfg.image_size}px image -> {self.hidden_size}; matrices "
                f"{', '.join(kinds)}; attention {str(self.tower.attention_dtype)[6:]} "
                f"({self.tower.attention_why})")

