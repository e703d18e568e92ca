"""Gemma 3's image preprocessing and image prompt (Gemma3ForConditionalGeneration).

Equal to transformers' slow ``Gemma3ImageProcessor`` (``use_fast=False``: Pillow + numpy) with
pan-and-scan off, its default: RGB (transparency over white), one resize of the whole image to
``size`` (896x896 in every release) with the configured Pillow filter, ``* rescale_factor``,
``(x - mean) / std``, channels first. ``detail`` is ignored: every image gets the one
resolution the SigLIP tower was trained at. Pan-and-scan (extra crops of wide images) is not
implemented; a preprocessor config that turns it on is refused.

The prompt is transformers' ``Gemma3Processor``'s: each ``<start_of_image>`` the chat template
writes becomes ``"\\n\\n<start_of_image>" + "<image_soft_token>" * mm_tokens_per_image +
"<end_of_image>\\n\\n"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from radixserve.multimodal.processor import ProcessedImage, special_token_id
from radixserve.multimodal.settings import preprocessor_settings, triple
from radixserve.multimodal.transforms import check_resample, rescale_normalize, to_rgb

__all__ = ["Gemma3ImageProcessor", "from_hf_folder", "from_mmproj"]

BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
DEFAULT_TOKENS_PER_IMAGE = 256  # config.json's mm_tokens_per_image when absent
DEFAULT_PROJ_SCALE = 4  # llama.cpp: patches per side / tokens per side, unless the mmproj says


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    """Gemma 3's `ImageProcessor`; the defaults are a release's preprocessor_config.json."""

    image_token_id: int
    num_image_tokens: int = DEFAULT_TOKENS_PER_IMAGE
    size: tuple[int, int] = (896, 896)  # (height, width)
    resample: int = int(Image.Resampling.BILINEAR)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def name(self) -> str:
        # the pixels tell sizes and statistics apart; the token count they do not
        return f"gemma3/{self.num_image_tokens}"

    @property
    def placeholder(self) -> str:
        return BOI_TOKEN

    def process(self, image: Image.Image, detail: str | None = None) -> ProcessedImage:
        height, width = self.size
        rgb = to_rgb(image).resize((width, height), resample=self.resample)
        pixels = rescale_normalize(np.asarray(rgb), self.rescale_factor, self.image_mean,
                                   self.image_std)
        return ProcessedImage.of(self.name, pixels, self.num_image_tokens)

    def expand(self, p: ProcessedImage) -> str:
        return f"\n\n{BOI_TOKEN}{IMAGE_TOKEN * p.num_tokens}{EOI_TOKEN}\n\n"


def _check_steps(cfg: Mapping[str, Any]) -> None:
    """Refuse settings this processor does not do (null means the default: on, pan-and-scan
    off)."""
    for key in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
        if cfg.get(key) is False:
            raise ValueError(f"Gemma 3 image preprocessing with {key}: false is not supported")
    if cfg.get("do_pan_and_scan"):
        raise ValueError("Gemma 3 pan-and-scan (do_pan_and_scan: true) is not supported")


def _size(cfg: Mapping[str, Any]) -> tuple[int, int]:
    size = cfg.get("size", {"height": 896, "width": 896})
    height, width = (size.get("height"), size.get("width")) if isinstance(size, dict) else (0, 0)
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ValueError(f"Gemma 3 preprocessor size must be {{height, width}}, got {size!r}")
    return height, width


def _image_token(tokenizer, config_id: int | None) -> int:
    """The ``<image_soft_token>`` id; the boundary tokens must be single special tokens too."""
    for token in (BOI_TOKEN, EOI_TOKEN):
        special_token_id(tokenizer, token)
    token_id = special_token_id(tokenizer, IMAGE_TOKEN)
    if config_id is not None and config_id != token_id:
        raise ValueError(f"config.json's image_token_index {config_id} is not the tokenizer's "
                         f"{IMAGE_TOKEN} ({token_id})")
    return token_id


def from_hf_folder(folder: Path, config: Mapping[str, Any], tokenizer) -> Gemma3ImageProcessor:
    """From a Gemma3ForConditionalGeneration folder: its preprocessor config (release values
    where a key is absent), config.json's ``mm_tokens_per_image`` and image token."""
    cfg = preprocessor_settings(folder)
    _check_steps(cfg)
    num_tokens = config.get("mm_tokens_per_image") or DEFAULT_TOKENS_PER_IMAGE
    token_id = config.get("image_token_index", config.get("image_token_id"))
    return Gemma3ImageProcessor(
        image_token_id=_image_token(tokenizer, token_id),
        num_image_tokens=int(num_tokens),
        size=_size(cfg),
        resample=check_resample(cfg.get("resample", Image.Resampling.BILINEAR)),
        rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
        image_mean=triple(cfg.get("image_mean", 0.5), "image_mean"),
        image_std=triple(cfg.get("image_std", 0.5), "image_std"))


def from_mmproj(meta: Mapping[str, Any], tokenizer) -> Gemma3ImageProcessor:
    """From llama.cpp's mmproj GGUF metadata (``clip.vision.*``, as convert_hf_to_gguf.py's
    Gemma3VisionModel writes it): the image side, mean and std; tokens per image =
    (image_size / patch_size / scale_factor)^2, the scale factor 4 unless written. Resize and
    rescale are the releases' (bilinear, 1/255): the converter does not store them."""
    image_size = meta.get("clip.vision.image_size")
    patch_size = meta.get("clip.vision.patch_size")
    scale = meta.get("clip.vision.projector.scale_factor", DEFAULT_PROJ_SCALE)
    if not all(isinstance(v, int) and v > 0 for v in (image_size, patch_size, scale)):
        raise ValueError(f"the mmproj's image_size {image_size!r}, patch_size {patch_size!r} "
                         f"and projector scale_factor {scale!r} must be positive integers")
    per_side = image_size // patch_size // scale
    if per_side == 0 or per_side * patch_size * scale != image_size:
        raise ValueError(f"the mmproj's image_size {image_size} is not a multiple of "
                         f"patch_size {patch_size} x scale_factor {scale}")
    return Gemma3ImageProcessor(
        image_token_id=_image_token(tokenizer, None),
        num_image_tokens=per_side * per_side,
        size=(image_size, image_size),
        image_mean=triple(meta.get("clip.vision.image_mean"), "clip.vision.image_mean"),
        image_std=triple(meta.get("clip.vision.image_std"), "clip.vision.image_std"))
