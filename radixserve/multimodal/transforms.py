"""The steps of transformers' slow (Pillow + numpy) image processors, bit for bit.

Each step does what ``transformers.image_transforms`` does on the same input, in the same
dtypes, so a family's processor built from them gives the same float32 pixels as
transformers' ``use_fast=False`` processor (the tests compare them exactly).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

__all__ = ["check_resample", "rescale_normalize", "to_rgb"]


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as RGB; transparency (an alpha band, or a palette/L image's ``transparency``)
    composited over white, as ``transformers.image_transforms.convert_to_rgb`` does. ValueError
    for a mode Pillow cannot convert."""
    try:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
        return image.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ValueError(f"cannot convert a {image.mode} image to RGB: {exc}") from exc


def rescale_normalize(rgb: np.ndarray, scale: float, mean: Sequence[float],
                      std: Sequence[float]) -> np.ndarray:
    """``(rgb * scale - mean) / std`` of an (H, W, 3) uint8 array, as float32 (3, H, W), C
    order. NOTE: transformers' ``rescale`` multiplies in float64 and rounds to float32 once;
    ``normalize`` then works in float32. Each output depends only on its byte and channel,
    so the 256 x 3 results are computed that way once and looked up (same bits, ~2x faster)."""
    levels = np.arange(256, dtype=np.float64)[:, None]
    table = (levels * scale).astype(np.float32)
    table = (table - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    out = np.empty((3, *rgb.shape[:2]), dtype=np.float32)
    for channel in range(3):
        np.take(table[:, channel], rgb[..., channel], out=out[channel])
    return out


def check_resample(value) -> int:
    """A Pillow resampling filter number (transformers' ``resample``: 0 nearest, 1 lanczos,
    2 bilinear, 3 bicubic, 4 box, 5 hamming); ValueError otherwise."""
    if isinstance(value, bool) or value not in {int(r) for r in Image.Resampling}:
        raise ValueError(f"resample {value!r} is not a Pillow resampling filter (0-5)")
    return int(value)
