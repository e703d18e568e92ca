"""SmolVLM's image preprocessing and image prompt (SmolVLMForConditionalGeneration).

Equal to transformers' slow ``SmolVLMImageProcessor`` (``use_fast=False``: Pillow + numpy) for
one image: RGB (transparency over white); a resize whose longest edge becomes ``longest_edge``
(the other edge keeps the aspect, rounded up to even; at most 4096); with splitting on, a
second resize to whole tiles (each edge up to a multiple of ``tile_size``), cut into rows x
cols tiles of ``tile_size`` squared, row by row, then the whole image resized to one more
tile, the global one (an image already one tile is only that); with splitting off, one resize
to a tile. Every resize uses the configured filter (Lanczos in the releases) on uint8 pixels;
then ``* rescale_factor``, ``(x - mean) / std``, channels first. Each tile is one encoder
input [3, tile_size, tile_size] and one `messages.ImageInput`.

The prompt is transformers' ``SmolVLMProcessor``'s: the chat template writes ``<image>`` per
image; it becomes, per tile row, ``<fake_token_around_image><row_r_col_c>`` + ``<image>`` x
``image_seq_len`` per tile and a newline, then ``\\n<fake_token_around_image><global-img>`` +
the global tile's image tokens + ``<fake_token_around_image>`` (without rows, only the
``<fake_token_around_image><global-img>...<fake_token_around_image>`` part).

``detail``: "low" gives the global tile alone (transformers' ``do_image_splitting=False``);
"high", "auto" and None follow the configuration.
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

from radixserve.multimodal.processor import ImageTiles, ProcessedImage, special_token_id
from radixserve.multimodal.settings import longest_edge, preprocessor_settings, triple
from radixserve.multimodal.transforms import check_resample, rescale_normalize, to_rgb

__all__ = ["SmolVLMImageProcessor", "from_hf_folder", "from_mmproj", "tile_grid_text"]

IMAGE_TOKEN = "<image>"
FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TOKEN = "<global-img>"
MAX_IMAGE_SIZE = 4096  # transformers' bound on the resized image's longest edge
EDGE_PER_TILE = 4  # releases: size.longest_edge = 4 x max_image_size (the mmproj default)


def tile_grid_text(rows: int, cols: int, tokens_per_tile: int) -> str:
    """transformers' ``get_image_prompt_string``: the text for an image of rows x cols tiles
    plus the global one (rows = cols = 0: the global tile alone)."""
    tile = IMAGE_TOKEN * tokens_per_tile
    glob = f"{FAKE_TOKEN}{GLOBAL_TOKEN}{tile}{FAKE_TOKEN}"
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{tile}" for c in range(cols))
                   + "\n" for r in range(rows))
    return f"{grid}\n{glob}"


def _resized_size(height: int, width: int, edge: int) -> tuple[int, int]:
    """(height, width) with the longest edge ``edge``, the other rounded up to even (never
    below 1), then both scaled under MAX_IMAGE_SIZE: transformers'
    ``_resize_output_size_rescale_to_max_len`` then ``..._scale_below_upper_bound``."""
    aspect = width / height
    if width >= height:
        width, height = edge, int(edge / aspect)
        height += height % 2
    else:
        height, width = edge, int(edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _whole_tiles_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' ``resize_for_vision_encoder``: both edges up to multiples of ``tile``,
    the short one from the long one's aspect first."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


@dataclass(frozen=True)
class SmolVLMImageProcessor:
    """SmolVLM's `TilingImageProcessor`; defaults: a SmolVLM2 release's at ``tile_size``."""

    image_token_id: int
    tokens_per_tile: int
    tile_size: int  # max_image_size.longest_edge: the encoder's image side
    longest_edge: int  # size.longest_edge
    do_image_splitting: bool = True
    resample: int = int(Image.Resampling.LANCZOS)
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def name(self) -> str:
        # the pixels tell sizes and statistics apart; the token count they do not
        return f"smolvlm/{self.tokens_per_tile}"

    @property
    def placeholder(self) -> str:
        return IMAGE_TOKEN

    def process_tiles(self, image: Image.Image, detail: str | None = None) -> ImageTiles:
        """The tiles in transformers' order (row by row, the global one last) and the text."""
        rgb = to_rgb(image)
        height, width = _resized_size(rgb.height, rgb.width, self.longest_edge)
        rgb = self._resize(rgb, height, width)
        tile = self.tile_size
        rows = cols = 0
        if self.do_image_splitting and detail != "low":
            height, width = _whole_tiles_size(height, width, tile)
            rgb = self._resize(rgb, height, width)
            if height > tile or width > tile:
                rows, cols = height // tile, width // tile
        crops = []
        if rows:
            full = self._pixels(rgb)
            crops = [full[:, r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]
                     for r in range(rows) for c in range(cols)]
        crops.append(self._pixels(self._resize(rgb, tile, tile)))
        tiles = tuple(ProcessedImage.of(self.name, c, self.tokens_per_tile) for c in crops)
        return ImageTiles(tiles, tile_grid_text(rows, cols, self.tokens_per_tile))

    def _resize(self, rgb: Image.Image, height: int, width: int) -> Image.Image:
        return rgb.resize((width, height), resample=self.resample)

    def _pixels(self, rgb: Image.Image) -> np.ndarray:
        return rescale_normalize(np.asarray(rgb), self.rescale_factor, self.image_mean,
                                 self.image_std)


def _check_steps(cfg: Mapping[str, Any]) -> None:
    """Refuse settings this processor does not do (null means the default: on)."""
    for key in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
        if cfg.get(key) is False:
            raise ValueError(f"SmolVLM image preprocessing with {key}: false is not supported")


def _image_token(tokenizer, config_id: int | None) -> int:
    """The ``<image>`` id; the tile boundary tokens must be single special tokens too."""
    for token in (FAKE_TOKEN, GLOBAL_TOKEN):
        special_token_id(tokenizer, token)
    token_id = special_token_id(tokenizer, IMAGE_TOKEN)
    if config_id is not None and config_id != token_id:
        raise ValueError(f"config.json's image_token_id {config_id} is not the tokenizer's "
                         f"{IMAGE_TOKEN} ({token_id})")
    return token_id


def _tokens_per_tile(image_size: Any, patch_size: Any, scale: Any, where: str) -> int:
    """(image_size / patch_size / scale)^2: the encoder's rows per tile after the connector's
    pixel shuffle."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (image_size, patch_size, scale)):
        raise ValueError(f"{where}: image_size {image_size!r}, patch_size {patch_size!r} and "
                         f"scale_factor {scale!r} must be positive integers")
    per_side = image_size // patch_size
    if per_side * patch_size != image_size or per_side % scale:
        raise ValueError(f"{where}: image_size {image_size} is not a multiple of patch_size "
                         f"{patch_size} x scale_factor {scale}")
    return (per_side // scale) ** 2


def from_hf_folder(folder: Path, config: Mapping[str, Any], tokenizer) -> SmolVLMImageProcessor:
    """From a SmolVLMForConditionalGeneration folder: preprocessor_config.json (else
    processor_config.json's ``image_processor``), processor_config.json's ``image_seq_len``,
    config.json's vision image/patch size, ``scale_factor`` and image token. ValueError when
    they disagree (tiles other than the encoder's image, another token count)."""
    cfg = preprocessor_settings(folder)
    _check_steps(cfg)
    vision = config.get("vision_config") or {}
    tile = longest_edge(cfg.get("max_image_size", {"longest_edge": 512}), "max_image_size")
    image_size = vision.get("image_size", tile)
    if image_size != tile:
        raise ValueError(f"max_image_size {tile} is not the vision encoder's image_size "
                         f"{image_size!r}")
    per_tile = _tokens_per_tile(image_size, vision.get("patch_size", 16),
                                config.get("scale_factor", 2), "config.json")
    seq_len = _processor_seq_len(folder)
    if seq_len is not None and seq_len != per_tile:
        raise ValueError(f"processor_config.json's image_seq_len {seq_len} is not the "
                         f"{per_tile} tokens per tile config.json gives")
    return SmolVLMImageProcessor(
        image_token_id=_image_token(tokenizer, config.get("image_token_id")),
        tokens_per_tile=per_tile,
        tile_size=tile,
        longest_edge=longest_edge(cfg.get("size", {"longest_edge": EDGE_PER_TILE * tile}),
                                  "size"),
        do_image_splitting=cfg.get("do_image_splitting") is not False,
        resample=check_resample(cfg.get("resample", Image.Resampling.LANCZOS)),
        rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
        image_mean=triple(cfg.get("image_mean", 0.5), "image_mean"),
        image_std=triple(cfg.get("image_std", 0.5), "image_std"))


def _processor_seq_len(folder: Path) -> int | None:
    """processor_config.json's ``image_seq_len``, None when not written."""
    path = folder / "processor_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("image_seq_len")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"processor_config.json's image_seq_len {value!r} is not an integer")
    return value


def from_mmproj(meta: Mapping[str, Any], tokenizer) -> SmolVLMImageProcessor:
    """From llama.cpp's mmproj GGUF metadata (projector type ``idefics3``, as
    convert_hf_to_gguf.py's SmolVLMModel writes it): the tile side (``clip.vision.image_size``),
    patch size and ``projector.scale_factor`` (tokens per tile), mean and std, and the resize's
    longest edge (``clip.vision.preproc_image_size``; 4 tiles when an older file lacks it).
    What the converter does not store is the releases' (llama.cpp's mtmd does the same):
    splitting on, Lanczos, 1/255. NOTE: tiles and prompt are transformers' (what the model
    was trained on); llama.cpp's mtmd differs in its own Lanczos kernel and in giving an image
    of one tile a 1 x 1 grid beside the global tile."""
    image_size = meta.get("clip.vision.image_size")
    per_tile = _tokens_per_tile(image_size, meta.get("clip.vision.patch_size"),
                                meta.get("clip.vision.projector.scale_factor", 2), "the mmproj")
    edge = meta.get("clip.vision.preproc_image_size", EDGE_PER_TILE * image_size)
    return SmolVLMImageProcessor(
        image_token_id=_image_token(tokenizer, None),
        tokens_per_tile=per_tile,
        tile_size=image_size,
        longest_edge=longest_edge({"longest_edge": edge}, "clip.vision.preproc_image_size"),
        image_mean=triple(meta.get("clip.vision.image_mean"), "clip.vision.image_mean"),
        image_std=triple(meta.get("clip.vision.image_std"), "clip.vision.image_std"))
