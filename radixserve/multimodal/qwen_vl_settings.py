"""The Qwen VL image processor's settings, from a Hugging Face folder or an mmproj GGUF
(the family module radixserve/multimodal/select.py names for Qwen2.5-VL, Qwen3-VL and Qwen3.5).

A folder's preprocessor_config.json as transformers reads it: ``min_pixels`` / ``max_pixels``
(Qwen2.5-VL's releases) override ``size: {shortest_edge, longest_edge}`` (Qwen3-VL's, Qwen3.5's;
``{min_pixels, max_pixels}`` in files older transformers saved); a key left out takes
``Qwen2VLImageProcessor``'s default, except patch, merge and temporal sizes, which then come
from config.json's vision_config (and must agree with it when both say).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from radixserve.multimodal.qwen_vl import CLIP_MEAN, CLIP_STD, QwenVLImageProcessor, image_token_id
from radixserve.multimodal.settings import preprocessor_settings, triple
from radixserve.multimodal.transforms import check_resample

__all__ = ["from_hf_folder", "from_mmproj"]

# config.json model_type / architectures -> the family name in the processor's name
_FOLDER_FAMILIES = {"qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl", "qwen3_5": "qwen3.5",
                    "qwen3_5_moe": "qwen3.5"}
_ARCHITECTURES = {"Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
                  "Qwen3VLForConditionalGeneration": "qwen3_vl",
                  "Qwen3_5ForConditionalGeneration": "qwen3_5",
                  "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}
# the releases' pixel limits (Qwen/Qwen2.5-VL-*-Instruct, Qwen/Qwen3-VL-*, Qwen/Qwen3.5-*), for
# an mmproj
_RELEASE_PIXELS = {"qwen2.5-vl": (3136, 12845056), "qwen3-vl": (65536, 16777216),
                   "qwen3.5": (65536, 16777216)}
_DEFAULT_PIXELS = (56 * 56, 28 * 28 * 1280)  # transformers' when a folder says nothing
# the vision_config key of each preprocessor size
_VISION_KEYS = {"patch_size": "patch_size", "merge_size": "spatial_merge_size",
                "temporal_patch_size": "temporal_patch_size"}
_DEFAULT_SIZES = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}


def from_hf_folder(folder: Path, config: Mapping[str, Any], tokenizer) -> QwenVLImageProcessor:
    """From a Qwen2_5_VLForConditionalGeneration / Qwen3VLForConditionalGeneration /
    Qwen3_5(Moe)ForConditionalGeneration folder: its preprocessor settings (module
    docstring) and config.json's image token. ValueError for settings this processor cannot
    follow."""
    kind = config.get("model_type")
    if kind not in _FOLDER_FAMILIES:
        kind = next((_ARCHITECTURES[a] for a in config.get("architectures") or ()
                     if a in _ARCHITECTURES), None)
    if kind is None:
        raise ValueError(f"not a Qwen2.5-VL, Qwen3-VL or Qwen3.5 config (model_type "
                         f"{config.get('model_type')!r})")
    cfg = preprocessor_settings(Path(folder))
    for key in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
        if cfg.get(key) is False:
            raise ValueError(f"Qwen VL image preprocessing with {key}: false is not supported")
    min_pixels, max_pixels = _pixel_limits(cfg)
    return QwenVLImageProcessor(
        image_token_id=image_token_id(tokenizer, config.get("image_token_id")),
        family=_FOLDER_FAMILIES[kind],
        **_sizes(cfg, config.get("vision_config") or {}),
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        resample=check_resample(cfg.get("resample", Image.Resampling.BICUBIC)),
        rescale_factor=_number(cfg.get("rescale_factor", 1 / 255), "rescale_factor"),
        image_mean=triple(cfg.get("image_mean", CLIP_MEAN), "image_mean"),
        image_std=triple(cfg.get("image_std", CLIP_STD), "image_std"))


def _sizes(cfg: Mapping[str, Any], vision: Mapping[str, Any]) -> dict[str, int]:
    """Patch, merge and temporal patch sizes: the preprocessor's, else vision_config's, else
    transformers' defaults; ValueError when the two files disagree."""
    sizes = {}
    for key, vision_key in _VISION_KEYS.items():
        mine, theirs = cfg.get(key), vision.get(vision_key)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(f"preprocessor {key} {mine!r} is not the vision encoder's "
                             f"{vision_key} {theirs!r}")
        sizes[key] = next(v for v in (mine, theirs, _DEFAULT_SIZES[key]) if v is not None)
    return sizes


def _pixel_limits(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(min_pixels, max_pixels) as transformers' ``Qwen2VLImageProcessor.__init__`` takes
    them (module docstring)."""
    size = cfg.get("size")
    if size is None:
        low, high = _DEFAULT_PIXELS
    elif isinstance(size, dict):
        low = size.get("shortest_edge", size.get("min_pixels"))
        high = size.get("longest_edge", size.get("max_pixels"))
    else:
        raise ValueError(f"Qwen VL preprocessor size must be {{shortest_edge, longest_edge}}, "
                         f"got {size!r}")
    low = cfg["min_pixels"] if cfg.get("min_pixels") is not None else low
    high = cfg["max_pixels"] if cfg.get("max_pixels") is not None else high
    if low is None or high is None:
        raise ValueError(f"Qwen VL preprocessor size must be {{shortest_edge, longest_edge}}, "
                         f"got {size!r}")
    return low, high


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{key} must be a positive number, got {value!r}")
    return float(value)


def from_mmproj(meta: Mapping[str, Any], tokenizer) -> QwenVLImageProcessor:
    """From llama.cpp's mmproj GGUF metadata: projector ``qwen2.5vl_merger`` (Qwen2.5-VL) or
    ``qwen3vl_merger`` (Qwen3-VL where ``clip.vision.is_deepstack_layers`` flags a block,
    Qwen3.5 where none).
    Patch size, mean and std from ``clip.vision.*``, the merge size from
    ``clip.vision.spatial_merge_size`` (2 where not written, as llama.cpp). The converter
    stores no pixel limits for these projectors and llama.cpp's mtmd then allows 8 to 4096
    tokens an image; NOTE: the limits here are instead the family's releases' (transformers':
    Qwen2.5-VL 4 to 16384 tokens, Qwen3-VL and Qwen3.5 64 to 16384), what the model was
    trained with.
    Temporal patch 2 (the two frame kernels the converter writes), bicubic, 1/255."""
    kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
    if kind == "qwen2.5vl_merger":
        family = "qwen2.5-vl"
    elif kind == "qwen3vl_merger":
        is_deepstack = any(meta.get("clip.vision.is_deepstack_layers") or ())
        family = "qwen3-vl" if is_deepstack else "qwen3.5"
    else:
        raise ValueError(f"projector type {kind!r} is not a Qwen2.5-VL, Qwen3-VL or Qwen3.5 "
                         f"one")
    min_pixels, max_pixels = _RELEASE_PIXELS[family]
    return QwenVLImageProcessor(
        image_token_id=image_token_id(tokenizer, None),
        family=family,
        patch_size=meta.get("clip.vision.patch_size"),
        merge_size=meta.get("clip.vision.spatial_merge_size", 2),
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        image_mean=triple(meta.get("clip.vision.image_mean"), "clip.vision.image_mean"),
        image_std=triple(meta.get("clip.vision.image_std"), "clip.vision.image_std"))
