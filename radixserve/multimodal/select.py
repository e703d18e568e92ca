"""Which image processor a served model takes, if any (API process; torch-free).

A family is one module under radixserve/multimodal/ with ``from_hf_folder(folder, config,
tokenizer)`` and ``from_mmproj(metadata, tokenizer)``, named below by the config.json
``model_type`` or the mmproj's projector type that selects it (imported on first use).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
from pathlib import Path
from typing import Any

from radixserve.gguf_reader import open_gguf
from radixserve.multimodal.mmproj_path import find_mmproj
from radixserve.multimodal.processor import ImageProcessor, TilingImageProcessor

logger = logging.getLogger(__name__)

__all__ = ["image_processor_for", "mmproj_metadata"]

# config.json model_type -> family module (Gemma 3's text-only 1B is "gemma3_text": no images)
_HF_FAMILIES = {"gemma3": "radixserve.multimodal.gemma3",
                "smolvlm": "radixserve.multimodal.smolvlm",
                "qwen2_5_vl": "radixserve.multimodal.qwen_vl_settings",
                "qwen3_vl": "radixserve.multimodal.qwen_vl_settings",
                "qwen3_5": "radixserve.multimodal.qwen_vl_settings",
                "qwen3_5_moe": "radixserve.multimodal.qwen_vl_settings",
                # Gemma 4's text-only checkpoints are "gemma4_text": no images
                "gemma4": "radixserve.multimodal.gemma4",
                "mistral3": "radixserve.multimodal.pixtral"}
# an mmproj's clip.projector_type (llama.cpp's PROJECTOR_TYPE_*) -> family module
_MMPROJ_FAMILIES = {"gemma3": "radixserve.multimodal.gemma3",
                    "idefics3": "radixserve.multimodal.smolvlm",
                    "qwen2.5vl_merger": "radixserve.multimodal.qwen_vl_settings",
                    # Qwen3-VL's (deepstack layers) and Qwen3.5's (none)
                    "qwen3vl_merger": "radixserve.multimodal.qwen_vl_settings",
                    # Gemma 4's (E2B / E4B files hold the audio projector "gemma4a" beside it)
                    "gemma4v": "radixserve.multimodal.gemma4",
                    # Mistral 3's (and the original Pixtral 12B's: no merger)
                    "pixtral": "radixserve.multimodal.pixtral"}
_ARCHITECTURES = {"Gemma3ForConditionalGeneration": "gemma3",  # where model_type is missing
                  "SmolVLMForConditionalGeneration": "smolvlm",
                  "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
                  "Qwen3VLForConditionalGeneration": "qwen3_vl",
                  "Qwen3_5ForConditionalGeneration": "qwen3_5",
                  "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
                  "Gemma4ForConditionalGeneration": "gemma4",
                  "Mistral3ForConditionalGeneration": "mistral3"}


def image_processor_for(model_path: str, mmproj: str | None,
                        tokenizer) -> ImageProcessor | TilingImageProcessor | None:
    """The processor for images to this model, None for a text-only one.

    ``mmproj`` (llama.cpp's vision GGUF beside a text GGUF) wins when given; else a Hugging
    Face folder is a vision model by its config.json; a GGUF alone is text-only. ``tokenizer``:
    the served model's (it names the image tokens). ValueError for an mmproj this server cannot
    preprocess for (its projector type named) or a vision config it cannot read.
    """
    if mmproj is not None:
        meta = mmproj_metadata(mmproj)
        kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")
        if kind is None and meta.get("clip.audio.projector_type") is not None:
            raise ValueError(f"{mmproj} is an audio-only mmproj (projector type "
                             f"{meta['clip.audio.projector_type']!r}): radixserve reads images "
                             f"only; give the model's vision mmproj")
        if kind is None:
            raise ValueError(f"{mmproj} is not an mmproj GGUF (no clip.projector_type)")
        if kind not in _MMPROJ_FAMILIES:
            raise ValueError(f"{mmproj}: projector type {kind!r} is not supported yet "
                             f"(supported: {', '.join(sorted(_MMPROJ_FAMILIES))})")
        return importlib.import_module(_MMPROJ_FAMILIES[kind]).from_mmproj(meta, tokenizer)
    folder = Path(model_path)
    config_path = folder / "config.json"
    if not (folder.is_dir() and config_path.is_file()):
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    kind = config.get("model_type")
    if kind not in _HF_FAMILIES:
        kind = next((_ARCHITECTURES[a] for a in config.get("architectures") or ()
                     if a in _ARCHITECTURES), None)
    if kind is None:
        return None
    return importlib.import_module(_HF_FAMILIES[kind]).from_hf_folder(folder, config, tokenizer)


def mmproj_metadata(path: str) -> dict[str, Any]:
    """The ``general.*`` and ``clip.*`` key-values of an mmproj GGUF, decoded (numbers, strings,
    lists); ValueError if the file is not a readable GGUF."""
    reader = open_gguf(path)
    return {key: field.contents() for key, field in reader.fields.items()
            if key.startswith(("general.", "clip."))}


def image_processor(model_path: str | None, mmproj: str | None, tokenizer,
                    max_tokens: int | None = None) -> ImageProcessor | TilingImageProcessor | None:
    """`image_processor_for` as a server starts it: ``mmproj`` as given (``--mmproj``), else
    the one beside a GGUF model (multimodal/mmproj_path.py), as the engine finds it. One found
    that does not fit the model is not used (a WARNING; the engine leaves it out too), nor is
    a folder's own preprocessing it cannot read (a WARNING: the text serves, images get a 400).
    ``max_tokens`` (``--image-max-tokens``): the most tokens an image may take where the family
    sizes images to their content (Qwen VL: larger ones are downscaled); a family of one fixed
    size (Gemma 3, SmolVLM's tiles) keeps its own."""
    if not model_path:
        return None
    if mmproj is not None:
        return with_max_tokens(image_processor_for(model_path, mmproj, tokenizer), max_tokens)
    found = find_mmproj(model_path)
    try:
        return with_max_tokens(image_processor_for(model_path, found, tokenizer), max_tokens)
    except ValueError as exc:
        logger.warning("images are off: %s cannot be used: %s", found or model_path, exc)
        return None


def with_max_tokens(processor, max_tokens: int | None):
    """``processor`` capped at ``max_tokens`` an image where it has such a cap (a dataclass
    field ``max_tokens``: Qwen VL's); as it is otherwise."""
    if processor is None or max_tokens is None or not hasattr(processor, "max_tokens"):
        return processor
    return dataclasses.replace(processor, max_tokens=max_tokens)
