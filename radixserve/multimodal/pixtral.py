"""Mistral 3's image preprocessing and image prompt (Mistral3ForConditionalGeneration: Ministral 3,
Mistral Small 3.1 / 3.2; the Pixtral vision tower with a 2 x 2 patch merger).

Equal to transformers' slow ``PixtralImageProcessorPil`` as ``PixtralProcessor`` runs it (its
``patch_size`` argument set to the processor's ``patch_size * spatial_merge_size``: 28 in the
releases, one token's side) for one image: RGB (transparency over white); `fit`: scaled down
(floor) so the longest edge is at most ``longest_edge`` (1540 in the releases), then each edge
rounded UP to a multiple of the token side (small images grow to it); one resize with the
configured Pillow filter (bicubic) on uint8 pixels; ``* rescale_factor``, ``(x - mean) / std``
(CLIP's). The pixels are that image, ``[3, H, W]`` float32, unpadded; the token grid is
``(1, H / side, W / side)`` and ``num_tokens`` its product.

Token caps: ``detail="low"`` allows `LOW_DETAIL_TOKENS`, ``max_tokens`` (the server's
``--image-max-tokens``) caps every image; under a cap the image gets transformers' size for the
largest ``longest_edge`` whose grid holds at most that many tokens (the aspect kept as
transformers keeps it).
NOTE: where transformers' floor gives an edge of 0 pixels (an image thinner than about
1 : longest_edge) transformers fails (Pillow refuses the resize); here that edge is 1 pixel,
one token.

The prompt is transformers' ``PixtralProcessor``'s: the chat template writes ``[IMG]`` per
image, which becomes, per grid row, ``[IMG]`` * cols and ``[IMG_BREAK]``, the last row ending
in ``[IMG_END]`` instead (`ProcessedImage.row_breaks`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from radixserve.multimodal.processor import ProcessedImage, special_token_id
from radixserve.multimodal.settings import longest_edge, preprocessor_settings, triple
from radixserve.multimodal.transforms import check_resample, rescale_normalize, to_rgb

__all__ = ["LOW_DETAIL_TOKENS", "PixtralImageProcessor", "fit", "from_hf_folder", "from_mmproj"]

IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' Pixtral defaults (CLIP's)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# OpenAI's low detail is one 512 x 512 view: 16 x 16 tokens (448 x 448 at 28 px a token)
LOW_DETAIL_TOKENS = 256


def fit(height: int, width: int, edge: int, side: int) -> tuple[int, int]:
    """transformers' ``get_resize_output_image_size`` for ``longest_edge`` ``edge`` and patch
    ``side``: the (height, width) an image is resized to (module docstring; an edge floored
    to 0 is 1 pixel). ValueError for an empty image."""
    if height <= 0 or width <= 0:
        raise ValueError(f"the image is empty ({width} x {height} pixels)")
    # NOTE: the same float operations in the same order as transformers
    ratio = max(height / edge, width / edge)
    if ratio > 1:
        height = max(1, math.floor(height / ratio))
        width = max(1, math.floor(width / ratio))
    return ((height - 1) // side + 1) * side, ((width - 1) // side + 1) * side


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Mistral 3 {key} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class PixtralImageProcessor:
    """Mistral 3's `ImageProcessor` (module docstring); the defaults are the releases'.
    ``max_tokens``: the server's cap on tokens an image (None: ``longest_edge`` alone), set
    with ``dataclasses.replace``."""

    image_token_id: int
    patch_size: int = 14
    merge_size: int = 2
    longest_edge: int = 1540
    max_tokens: int | None = None
    resample: int = int(Image.Resampling.BICUBIC)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    image_token: str = IMAGE_TOKEN
    break_token: str = BREAK_TOKEN
    end_token: str = END_TOKEN

    def __post_init__(self) -> None:
        for key in ("patch_size", "merge_size", "longest_edge"):
            _positive_int(getattr(self, key), key)
        if self.max_tokens is not None:
            _positive_int(self.max_tokens, "max_tokens")
        if isinstance(self.rescale_factor, bool) or not isinstance(
                self.rescale_factor, int | float) or self.rescale_factor <= 0:
            raise ValueError(f"rescale_factor must be a positive number, got "
                             f"{self.rescale_factor!r}")

    @property
    def name(self) -> str:
        # what changes the pixels or their meaning; the size shows in their shape
        return (f"pixtral/patch{self.patch_size}/merge{self.merge_size}"
                f"/resample{self.resample}/scale{self.rescale_factor!r}"
                f"/mean{list(self.image_mean)}/std{list(self.image_std)}")

    @property
    def placeholder(self) -> str:
        return self.image_token

    @property
    def side(self) -> int:
        """Pixels per token side: an image's edges are multiples of it."""
        return self.patch_size * self.merge_size

    def cap(self, detail: str | None = None) -> int | None:
        """The most tokens an image with this ``detail`` may take (None: no cap)."""
        caps = [c for c in (self.max_tokens, LOW_DETAIL_TOKENS if detail == "low" else None)
                if c is not None]
        return min(caps, default=None)

    def edge(self, height: int, width: int, detail: str | None = None) -> int:
        """The ``longest_edge`` an image of this size is resized for: the configured one, or
        under a `cap` the largest at most that whose grid holds at most cap tokens (tokens
        grow with the edge: a bisection; an edge of 1 gives one token)."""
        cap = self.cap(detail)
        if cap is None or self._tokens(height, width, self.longest_edge) <= cap:
            return self.longest_edge
        low, high = 1, self.longest_edge  # tokens(low) <= cap < tokens(high)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self._tokens(height, width, mid) <= cap else (low, mid)
        return low

    def _tokens(self, height: int, width: int, edge: int) -> int:
        h, w = fit(height, width, edge, self.side)
        return (h // self.side) * (w // self.side)

    def resized_size(self, height: int, width: int, detail: str | None = None) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to; ValueError if empty."""
        return fit(height, width, self.edge(height, width, detail), self.side)

    def process(self, image: Image.Image, detail: str | None = None) -> ProcessedImage:
        height, width = self.resized_size(image.height, image.width, detail)
        rgb = to_rgb(image)
        if rgb.size != (width, height):  # Pillow's resize to the same size is a copy
            rgb = rgb.resize((width, height), resample=self.resample)
        chw = rescale_normalize(np.asarray(rgb), self.rescale_factor, self.image_mean,
                                self.image_std)
        rows, cols = height // self.side, width // self.side
        return ProcessedImage.of(self.name, chw, rows * cols, (1, rows, cols), row_breaks=True)

    def expand(self, p: ProcessedImage) -> str:
        _, rows, cols = p.grid
        row = self.image_token * cols
        return (row + self.break_token) * (rows - 1) + row + self.end_token


def _token_id(tokenizer, tokens: Mapping[str, str], config_id: Any) -> int:
    """The image token's id; the break and end tokens must be single special tokens too, and
    config.json's ``image_token_index`` (where given) the image token's id."""
    ids = {key: special_token_id(tokenizer, token) for key, token in tokens.items()}
    if config_id is not None and config_id != ids["image_token"]:
        raise ValueError(f"config.json's image_token_index {config_id} is not the tokenizer's "
                         f"{tokens['image_token']} ({ids['image_token']})")
    return ids["image_token"]


def _processor_config(folder: Path) -> dict[str, Any]:
    """processor_config.json's top level (PixtralProcessor's own arguments), or {}."""
    path = folder / "processor_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _sizes(proc: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, int]:
    """Patch and merge sizes: processor_config.json's (what PixtralProcessor takes), else
    config.json's (vision_config.patch_size, spatial_merge_size), else Mistral3Config's
    defaults (14, 2). NOTE: transformers' processor would fall back to its own 16 and 1, which
    do not fit a Mistral 3 model; the releases write both. ValueError where the files differ."""
    theirs = {"patch_size": (config.get("vision_config") or {}).get("patch_size"),
              "spatial_merge_size": config.get("spatial_merge_size")}
    sizes = {}
    for key, default in (("patch_size", 14), ("spatial_merge_size", 2)):
        mine = proc.get(key)
        if mine is not None and theirs[key] is not None and mine != theirs[key]:
            raise ValueError(f"processor_config.json's {key} {mine!r} is not config.json's "
                             f"{theirs[key]!r}")
        sizes[key] = next(v for v in (mine, theirs[key], default) if v is not None)
    return {"patch_size": sizes["patch_size"], "merge_size": sizes["spatial_merge_size"]}


def from_hf_folder(folder: Path, config: Mapping[str, Any], tokenizer) -> PixtralImageProcessor:
    """From a Mistral3ForConditionalGeneration folder: the image processor's settings
    (preprocessor_config.json, else processor_config.json's ``image_processor``; a key left
    out: transformers' ``PixtralImageProcessorPil`` default, e.g. longest edge 1024), the
    processor's sizes (`_sizes`) and token names from processor_config.json, config.json's
    image token. ValueError for settings this processor cannot follow."""
    folder = Path(folder)
    cfg = preprocessor_settings(folder)
    for key in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
        if cfg.get(key) is False:
            raise ValueError(f"Mistral 3 image preprocessing with {key}: false is not supported")
    if cfg.get("do_center_crop"):
        raise ValueError("Mistral 3 image preprocessing with do_center_crop is not supported")
    proc = _processor_config(folder)
    tokens = {"image_token": proc.get("image_token", IMAGE_TOKEN),
              "break_token": proc.get("image_break_token", BREAK_TOKEN),
              "end_token": proc.get("image_end_token", END_TOKEN)}
    if not all(isinstance(t, str) and t for t in tokens.values()):
        raise ValueError(f"processor_config.json's image tokens must be strings, got {tokens}")
    config_id = config.get("image_token_index", config.get("image_token_id"))
    return PixtralImageProcessor(
        image_token_id=_token_id(tokenizer, tokens, config_id),
        **_sizes(proc, config),
        longest_edge=longest_edge(cfg.get("size", {"longest_edge": 1024}), "size"),
        resample=check_resample(cfg.get("resample", Image.Resampling.BICUBIC)),
        rescale_factor=cfg.get("rescale_factor", 1 / 255),
        image_mean=triple(cfg.get("image_mean", CLIP_MEAN), "image_mean"),
        image_std=triple(cfg.get("image_std", CLIP_STD), "image_std"),
        **tokens)


def from_mmproj(meta: Mapping[str, Any], tokenizer) -> PixtralImageProcessor:
    """From llama.cpp's mmproj GGUF metadata (projector ``pixtral``, as its converter's
    LlavaVisionModel writes it for Mistral 3 and Pixtral): patch size, mean and std from
    ``clip.vision.*`` (where not written: the Mistral 3 releases' 14 and CLIP's); the merge
    size from ``clip.vision.spatial_merge_size`` (1 where not written, as llama.cpp: the
    converter writes it wherever the config has it, and the original Pixtral 12B merges
    nothing); the longest edge from ``clip.vision.preproc_image_size``, else
    ``clip.vision.image_size`` (the vision config's image size: 1540 in the Mistral 3
    releases, their processors' longest edge), else 1540.
    NOTE: llama.cpp's clip.cpp instead scales pixtral images into 8 to 1024 tokens; this
    follows the releases' processor (up to 55 x 55 tokens), what the model was trained with.
    Bicubic and 1/255, as both; the tokens [IMG], [IMG_BREAK], [IMG_END]."""
    kind = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type")
    if kind != "pixtral":
        raise ValueError(f"projector type {kind!r} is not Mistral 3's vision projector "
                         f"('pixtral')")
    edge = meta.get("clip.vision.preproc_image_size", meta.get("clip.vision.image_size", 1540))
    tokens = {"image_token": IMAGE_TOKEN, "break_token": BREAK_TOKEN, "end_token": END_TOKEN}
    return PixtralImageProcessor(
        image_token_id=_token_id(tokenizer, tokens, None),
        patch_size=meta.get("clip.vision.patch_size", 14),
        merge_size=meta.get("clip.vision.spatial_merge_size", 1),
        longest_edge=edge,
        image_mean=triple(meta.get("clip.vision.image_mean", CLIP_MEAN), "clip.vision.image_mean"),
        image_std=triple(meta.get("clip.vision.image_std", CLIP_STD), "clip.vision.image_std"))
