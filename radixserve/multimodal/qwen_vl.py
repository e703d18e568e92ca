"""Qwen VL image preprocessing and image prompt: Qwen2.5-VL and Qwen3.5 (their dense and MoE
models), which both run transformers' ``Qwen2VLImageProcessor``.

Equal to transformers' slow ``Qwen2VLImageProcessor`` (``Qwen2VLImageProcessorPil``: Pillow +
numpy) for one image: RGB (transparency over white); `smart_resize` to edges that are
multiples of ``patch_size * merge_size`` with the pixel count within [min_pixels, max_pixels];
one resize with the configured Pillow filter (bicubic in the releases) on uint8 pixels;
``* rescale_factor``, ``(x - mean) / std``; then the image cut into patches, each repeated
``temporal_patch_size`` times (a still image is one frame group), rows in transformers' order
(merge windows consecutive). The pixels are those ``pixel_values`` rows reshaped to
``[grid_t, grid_h, grid_w, C*T*P*P]`` (``grid_t`` = 1; the patch grid), ``grid`` is the token
grid ``(1, grid_h / merge, grid_w / merge)`` and ``num_tokens`` its product.

The prompt is transformers' ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``'s: the chat
template writes ``<|vision_start|><|image_pad|><|vision_end|>`` per image and each
``<|image_pad|>`` becomes ``num_tokens`` of them.

Token limits, on top of the configured pixel limits (each lowers max_pixels to
``tokens * (patch * merge)^2``, never below min_pixels): ``detail="low"`` allows at most
`LOW_DETAIL_TOKENS` tokens (OpenAI's low detail is one 512 x 512 view: 256 tokens is that view
at Qwen3.5's 32 px a token, 448 x 448 at Qwen2.5-VL's 28); ``max_tokens`` (the server's
``--image-max-tokens``) caps every image. Under a cap an image gets transformers' size for the
lowered max_pixels, except that a long edge is cut further where transformers' rounding would
still exceed the cap (very thin images); then ``num_tokens <= max(cap, min_pixels /
(patch * merge)^2)``.

The settings of a folder or an mmproj GGUF: radixserve/multimodal/qwen_vl_settings.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from radixserve.multimodal.processor import ProcessedImage, special_token_id
from radixserve.multimodal.transforms import rescale_normalize, to_rgb

__all__ = ["LOW_DETAIL_TOKENS", "QwenVLImageProcessor", "image_token_id", "smart_resize"]

IMAGE_TOKEN = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
LOW_DETAIL_TOKENS = 256
MAX_ASPECT_RATIO = 200  # transformers refuses flatter images
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """transformers' ``smart_resize``: (height, width) rounded to multiples of ``factor``, then
    scaled down (floor) when above ``max_pixels`` or up (ceil) when below ``min_pixels``,
    keeping the aspect. ValueError for an empty image or an aspect ratio over 200."""
    if height <= 0 or width <= 0:
        raise ValueError(f"the image is empty ({width} x {height} pixels)")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"the image's aspect ratio {max(height, width) / min(height, width):g} "
                         f"is over {MAX_ASPECT_RATIO}")
    # NOTE: the same float operations in the same order as transformers (round half to even)
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _within(h_bar: int, w_bar: int, factor: int, cap: int) -> tuple[int, int]:
    """(h_bar, w_bar) cut, long edge first, to at most ``cap`` pixels (multiples of
    ``factor``, at least one each; ``cap >= factor^2``). Unchanged when already within."""
    if h_bar * w_bar <= cap:
        return h_bar, w_bar
    short, long = sorted((h_bar, w_bar))
    long = max(factor, cap // short // factor * factor)
    short = min(short, max(factor, cap // long // factor * factor))
    return (short, long) if h_bar <= w_bar else (long, short)


@dataclass(frozen=True)
class QwenVLImageProcessor:
    """Qwen VL's `ImageProcessor` (module docstring); the defaults are transformers'
    ``Qwen2VLImageProcessor``'s (Qwen2.5-VL's patch, merge and statistics). ``family`` names
    the model (it goes into ``name``); ``max_tokens``: the server's cap on tokens per image
    (None: the pixel limits alone), set with ``dataclasses.replace``."""

    image_token_id: int
    family: str = "qwen2.5-vl"
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    max_tokens: int | None = None
    resample: int = int(Image.Resampling.BICUBIC)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    def __post_init__(self) -> None:
        sizes = {"patch_size": self.patch_size, "merge_size": self.merge_size,
                 "temporal_patch_size": self.temporal_patch_size,
                 "min_pixels": self.min_pixels, "max_pixels": self.max_pixels}
        for key, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Qwen VL {key} must be a positive integer, got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"Qwen VL min_pixels {self.min_pixels} is over max_pixels "
                             f"{self.max_pixels}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool)
                                            or not isinstance(self.max_tokens, int)
                                            or self.max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")

    @property
    def name(self) -> str:
        # every setting that changes the pixels (the cap and detail show in the pixels' shape)
        return (f"{self.family}/patch{self.patch_size}/merge{self.merge_size}"
                f"/t{self.temporal_patch_size}/pixels{self.min_pixels}-{self.max_pixels}"
                f"/resample{self.resample}/scale{self.rescale_factor!r}"
                f"/mean{list(self.image_mean)}/std{list(self.image_std)}")

    @property
    def placeholder(self) -> str:
        return IMAGE_TOKEN

    @property
    def factor(self) -> int:
        """Pixels per token side: an image's edges are multiples of it."""
        return self.patch_size * self.merge_size

    def resized_size(self, height: int, width: int, detail: str | None = None) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to (module docstring)."""
        caps = [c for c in (self.max_tokens, LOW_DETAIL_TOKENS if detail == "low" else None)
                if c is not None]
        if not caps:
            return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        cap = max(min(self.max_pixels, min(caps) * self.factor ** 2), self.min_pixels)
        h_bar, w_bar = smart_resize(height, width, self.factor, self.min_pixels, cap)
        return _within(h_bar, w_bar, self.factor, cap)

    def process(self, image: Image.Image, detail: str | None = None) -> ProcessedImage:
        height, width = self.resized_size(image.height, image.width, detail)
        rgb = to_rgb(image).resize((width, height), resample=self.resample)
        chw = rescale_normalize(np.asarray(rgb), self.rescale_factor, self.image_mean,
                                self.image_std)
        pixels = self._patches(chw)
        grid = (1, pixels.shape[1] // self.merge_size, pixels.shape[2] // self.merge_size)
        return ProcessedImage.of(self.name, pixels, math.prod(grid), grid)

    def _patches(self, chw: np.ndarray) -> np.ndarray:
        """[C, H, W] -> [1, H / P, W / P, C * T * P * P]: transformers' ``pixel_values`` rows
        (merge window by merge window, row-major inside a window; each row C, then the T
        repeated frames, then P x P) in the same bytes."""
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        channels, height, width = chw.shape
        grid_h, grid_w = height // p, width // p
        blocks = chw.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
        blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
        frames = np.broadcast_to(blocks, (*blocks.shape[:5], t, p, p))
        return frames.reshape(1, grid_h, grid_w, channels * t * p * p)

    def expand(self, p: ProcessedImage) -> str:
        return IMAGE_TOKEN * p.num_tokens


def image_token_id(tokenizer, config_id: int | None) -> int:
    """The ``<|image_pad|>`` id; ``<|vision_start|>`` / ``<|vision_end|>`` must be single
    special tokens too. ValueError when config.json names another id."""
    for token in (VISION_START, VISION_END):
        special_token_id(tokenizer, token)
    token_id = special_token_id(tokenizer, IMAGE_TOKEN)
    if config_id is not None and config_id != token_id:
        raise ValueError(f"config.json's image_token_id {config_id} is not the tokenizer's "
                         f"{IMAGE_TOKEN} ({token_id})")
    return token_id

