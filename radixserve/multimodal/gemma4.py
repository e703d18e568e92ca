"""Gemma 4's image preprocessing and image prompt (Gemma4ForConditionalGeneration: E2B, E4B,
26B-A4B, 31B; images only, not audio or video).

Equal to transformers' slow ``Gemma4ImageProcessorPil`` for one image: RGB (transparency over
white); `target_size`: the largest size keeping the aspect whose edges are multiples of
``patch_size * pooling_kernel_size`` and which holds at most ``budget * pooling_kernel_size^2``
patches (an image too thin for that gets one pooling window across and up to ``budget`` along);
one resize with the configured Pillow filter (bicubic in the releases) on uint8 pixels, skipped
where the size already fits; ``* rescale_factor``; ``(x - mean) / std`` only with
``do_normalize`` (off in the releases: the model maps [0, 1] to [-1, 1] itself). The pixels are
the image's patches, unpadded: ``[ph, pw, P * P * 3]``, ``pixels[r, c]`` the patch at row r,
column c, its values pixel row by pixel row, channel last (transformers'
``convert_image_to_patches``); ``num_tokens = ph * pw / pooling_kernel_size^2``.

The budget is one of `SUPPORTED_BUDGETS` (transformers' ``max_soft_tokens``): the configured
one (280 in the releases); ``detail="low"``: the smallest (70); ``max_tokens`` (the server's
``--image-max-tokens``) caps it at the largest supported budget within the cap, never below the
smallest. An image takes at most its budget's tokens, fewer where its aspect leaves some over.

The prompt is transformers' ``Gemma4Processor``'s: the chat template writes ``<|image|>`` per
image and each becomes ``<|image>`` + ``<|image|>`` * num_tokens + ``<image|>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from radixserve.multimodal.processor import ProcessedImage, special_token_id
from radixserve.multimodal.settings import preprocessor_settings, triple
from radixserve.multimodal.transforms import check_resample, rescale_normalize, to_rgb

__all__ = ["SUPPORTED_BUDGETS", "Gemma4ImageProcessor", "from_hf_folder", "from_mmproj",
           "target_size"]

IMAGE_TOKEN = "<|image|>"
BOI_TOKEN = "<|image>"
EOI_TOKEN = "<image|>"
SUPPORTED_BUDGETS = (70, 140, 280, 560, 1120)  # the max_soft_tokens transformers accepts
IDENTITY = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # mean, std: no normalization


def target_size(height: int, width: int, patch_size: int, max_patches: int,
                kernel: int) -> tuple[int, int]:
    """transformers' ``get_aspect_ratio_preserving_size``: the (height, width) an image is
    resized to (module docstring). ValueError for an empty image."""
    if height <= 0 or width <= 0:
        raise ValueError(f"the image is empty ({width} x {height} pixels)")
    # NOTE: the same float operations in the same order as transformers
    target_px = max_patches * patch_size ** 2
    factor = math.sqrt(target_px / (height * width))
    side = kernel * patch_size
    target_h = math.floor(factor * height / side) * side
    target_w = math.floor(factor * width / side) * side
    if target_h == 0 and target_w == 0:
        raise ValueError(f"a {width} x {height} image would be resized to nothing")
    max_side = (max_patches // kernel ** 2) * side
    if target_h == 0:
        target_h, target_w = side, min(math.floor(width / height) * side, max_side)
    elif target_w == 0:
        target_h, target_w = min(math.floor(height / width) * side, max_side), side
    if target_h * target_w > target_px:
        raise ValueError(f"a {width} x {height} image would take over {max_patches} patches")
    return target_h, target_w


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Gemma 4 {key} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Gemma4ImageProcessor:
    """Gemma 4's `ImageProcessor` (module docstring); the defaults are transformers' and the
    releases'. ``max_tokens``: the server's cap on tokens an image (None: the budget alone),
    set with ``dataclasses.replace``."""

    image_token_id: int
    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 280
    max_tokens: int | None = None
    resample: int = int(Image.Resampling.BICUBIC)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = IDENTITY[0]
    image_std: tuple[float, float, float] = IDENTITY[1]

    def __post_init__(self) -> None:
        _positive_int(self.patch_size, "patch_size")
        _positive_int(self.pooling_kernel_size, "pooling_kernel_size")
        if self.max_soft_tokens not in SUPPORTED_BUDGETS:
            raise ValueError(f"Gemma 4 max_soft_tokens must be one of {SUPPORTED_BUDGETS}, got "
                             f"{self.max_soft_tokens!r}")
        if self.max_tokens is not None:
            _positive_int(self.max_tokens, "max_tokens")

    @property
    def name(self) -> str:
        # what changes the pixels; the budget shows in their shape (equal pixels, equal output)
        return (f"gemma4/patch{self.patch_size}/pool{self.pooling_kernel_size}"
                f"/resample{self.resample}/scale{self.rescale_factor!r}"
                f"/mean{list(self.image_mean)}/std{list(self.image_std)}")

    @property
    def placeholder(self) -> str:
        return IMAGE_TOKEN

    def budget(self, detail: str | None = None) -> int:
        """The ``max_soft_tokens`` an image gets with this ``detail`` (module docstring)."""
        budget = SUPPORTED_BUDGETS[0] if detail == "low" else self.max_soft_tokens
        if self.max_tokens is not None:
            within = [b for b in SUPPORTED_BUDGETS if b <= self.max_tokens]
            budget = min(budget, max(within, default=SUPPORTED_BUDGETS[0]))
        return budget

    def resized_size(self, height: int, width: int, detail: str | None = None) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to; ValueError if empty."""
        return target_size(height, width, self.patch_size,
                           self.budget(detail) * self.pooling_kernel_size ** 2,
                           self.pooling_kernel_size)

    def process(self, image: Image.Image, detail: str | None = None) -> ProcessedImage:
        height, width = self.resized_size(image.height, image.width, detail)
        rgb = to_rgb(image)
        if rgb.size != (width, height):
            rgb = rgb.resize((width, height), resample=self.resample)
        chw = rescale_normalize(np.asarray(rgb), self.rescale_factor, self.image_mean,
                                self.image_std)
        p = self.patch_size
        ph, pw = height // p, width // p
        patches = chw.reshape(3, ph, p, pw, p).transpose(1, 3, 2, 4, 0).reshape(ph, pw, -1)
        return ProcessedImage.of(self.name, patches, ph * pw // self.pooling_kernel_size ** 2)

    def expand(self, p: ProcessedImage) -> str:
        return f"{BOI_TOKEN}{IMAGE_TOKEN * p.num_tokens}{EOI_TOKEN}"


def _image_token(tokenizer, config: Mapping[str, Any]) -> int:
    """The ``<|image|>`` id; ``<|image>`` / ``<image|>`` must be single special tokens too,
    each the id config.json names where it names one."""
    ids = {}
    for token, key in ((BOI_TOKEN, "boi_token_id"), (EOI_TOKEN, "eoi_token_id"),
                       (IMAGE_TOKEN, "image_token_id")):
        ids[token] = special_token_id(tokenizer, token)
        if config.get(key) is not None and config[key] != ids[token]:
            raise ValueError(f"config.json's {key} {config[key]} is not the tokenizer's {token} "
                             f"({ids[token]})")
    return ids[IMAGE_TOKEN]


def _sizes(cfg: Mapping[str, Any], vision: Mapping[str, Any]) -> dict[str, int]:
    """Patch size and pooling kernel: the preprocessor's, else vision_config's, else
    transformers' defaults; ValueError when the two files disagree."""
    sizes = {}
    for key, default in (("patch_size", 16), ("pooling_kernel_size", 3)):
        mine, theirs = cfg.get(key), vision.get(key)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(f"preprocessor {key} {mine!r} is not the vision encoder's "
                             f"{theirs!r}")
        sizes[key] = next(v for v in (mine, theirs, default) if v is not None)
    return sizes


def from_hf_folder(folder: Path, config: Mapping[str, Any],
                   tokenizer) -> Gemma4ImageProcessor | None:
    """From a Gemma4ForConditionalGeneration folder: preprocessor_config.json or
    processor_config.json's ``image_processor`` as transformers reads it (a key left out:
    transformers' default), config.json's vision_config sizes and image tokens. None for a
    text-only config (``model_type: gemma4_text``, or ``vision_config: null``). ValueError for
    settings this processor cannot follow."""
    if config.get("model_type") == "gemma4_text" or (
            "vision_config" in config and config["vision_config"] is None):
        return None
    cfg = preprocessor_settings(Path(folder))
    for key in ("do_convert_rgb", "do_resize", "do_rescale"):
        if cfg.get(key) is False:
            raise ValueError(f"Gemma 4 image preprocessing with {key}: false is not supported")
    mean, std = IDENTITY
    if cfg.get("do_normalize"):
        mean = triple(cfg.get("image_mean", mean), "image_mean")
        std = triple(cfg.get("image_std", std), "image_std")
    rescale = cfg.get("rescale_factor", 1 / 255)
    if isinstance(rescale, bool) or not isinstance(rescale, int | float) or rescale <= 0:
        raise ValueError(f"rescale_factor must be a positive number, got {rescale!r}")
    return Gemma4ImageProcessor(
        image_token_id=_image_token(tokenizer, config),
        **_sizes(cfg, config.get("vision_config") or {}),
        max_soft_tokens=cfg.get("max_soft_tokens", 280),
        resample=check_resample(cfg.get("resample", Image.Resampling.BICUBIC)),
        rescale_factor=float(rescale),
        image_mean=mean,
        image_std=std)


def from_mmproj(meta: Mapping[str, Any], tokenizer) -> Gemma4ImageProcessor:
    """From llama.cpp's mmproj GGUF metadata (projector ``gemma4v``, as its converter's
    Gemma4VisionAudioModel writes it; an E2B / E4B file's audio projector ``gemma4a`` beside
    it is not read): patch size, mean and std from ``clip.vision.*`` (normalized with them, as
    llama.cpp does: the releases write 0 and 1), the pooling kernel from
    ``clip.vision.projector.scale_factor`` (3 where not written, as llama.cpp).
    NOTE: the file holds no token budget (its ``image_size`` is a dummy 224) and llama.cpp's
    clip.cpp then sizes gemma4v images like Qwen's (edges rounded to multiples of 48, scaled
    into 70 to 1120 tokens, small images upscaled); this follows transformers' release
    processor instead (``max_soft_tokens`` 280, its resize), what the model was trained with.
    Bicubic and 1/255, as both."""
    kind = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type")
    if kind != "gemma4v":
        raise ValueError(f"projector type {kind!r} is not Gemma 4's vision projector "
                         f"('gemma4v')")
    return Gemma4ImageProcessor(
        image_token_id=_image_token(tokenizer, {}),
        patch_size=meta.get("clip.vision.patch_size"),
        pooling_kernel_size=meta.get("clip.vision.projector.scale_factor", 3),
        image_mean=triple(meta.get("clip.vision.image_mean"), "clip.vision.image_mean"),
        image_std=triple(meta.get("clip.vision.image_std"), "clip.vision.image_std"))
