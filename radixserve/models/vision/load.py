"""Which vision encoder a model has, and loading it (engine process).

``find_mmproj`` finds llama.cpp's projector file beside a GGUF model; ``load_vision_encoder``
builds the encoder from an mmproj GGUF (``clip.projector_type``) or from a Hugging Face folder
(config.json's ``architectures``). A family is one entry in each table below and a module
with its builders (a folder's take its config.json and path, an mmproj's the GGUF reader);
the rest of the engine sees only the `VisionEncoder` protocol (models/vision/__init__.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import os

import torch

from radixserve.models.vision.siglip import SiglipConfig
from radixserve.models.vision.weights import GgufWeights, HfWeights
from radixserve.multimodal.mmproj_path import find_mmproj  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

# ``clip.projector_type`` / a folder's architecture → "module:function" (lazy imports)
GGUF_PROJECTORS = {"gemma3": "radixserve.models.vision.load:_gemma3_from_gguf",
                   "gemma4v": "radixserve.models.vision.gemma4_load:gemma4_vision_from_gguf",
                   "idefics3": "radixserve.models.vision.smolvlm_load:smolvlm_from_gguf",
                   "qwen2.5vl_merger":
                       "radixserve.models.vision.qwen2_5_vl_load:qwen25_vl_from_gguf",
                   "qwen3vl_merger":
                       "radixserve.models.vision.qwen3_vl_load:qwen3_vl_from_gguf",
                   "pixtral": "radixserve.models.vision.pixtral_load:pixtral_from_gguf"}
HF_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "radixserve.models.vision.load:_gemma3_from_hf",
    "Gemma4ForConditionalGeneration":
        "radixserve.models.vision.gemma4_load:gemma4_vision_from_hf",
    "SmolVLMForConditionalGeneration": "radixserve.models.vision.smolvlm_load:smolvlm_from_hf",
    "Qwen2_5_VLForConditionalGeneration":
        "radixserve.models.vision.qwen2_5_vl_load:qwen25_vl_from_hf",
    "Qwen3VLForConditionalGeneration":
        "radixserve.models.vision.qwen3_vl_load:qwen3_vl_vision_from_hf",
    "Qwen3_5ForConditionalGeneration":
        "radixserve.models.vision.qwen3_vl_load:qwen35_vision_from_hf",
    "Qwen3_5MoeForConditionalGeneration":
        "radixserve.models.vision.qwen3_vl_load:qwen35_vision_from_hf",
    "Mistral3ForConditionalGeneration": "radixserve.models.vision.pixtral_load:pixtral_from_hf"}


def load_vision_encoder(model_path: str, mmproj: str | None, device: torch.device,
                        dtype: torch.dtype):
    """The model's vision encoder (a `VisionEncoder`) on ``device``, or None for a text-only
    model. ``mmproj``: the projector GGUF to load (``--mmproj`` or ``find_mmproj``'s answer);
    without it a folder's config.json decides, and a GGUF model file is text only. Matrices
    keep their stored type where the engine runs it (models/vision/stored.py), the rest is in
    ``dtype``. ValueError for an mmproj that is not one, a projector type not supported yet, or
    missing or misshapen weights. Logs once at INFO what was loaded."""
    if mmproj is not None:
        encoder = _from_gguf(mmproj, device, dtype)
    elif os.path.isdir(model_path):
        encoder = _from_folder(model_path, device, dtype)
    else:
        return None
    if encoder is not None:
        logger.info("vision encoder from %s: %s", mmproj or model_path, encoder.describe())
    return encoder


def _resolve(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _from_gguf(path: str, device: torch.device, dtype: torch.dtype):
    from radixserve.gguf_reader import open_gguf

    reader = open_gguf(path)
    arch = _field(reader, "general.architecture")
    if arch != "clip" or not _field(reader, "clip.has_vision_encoder", False):
        raise ValueError(f"{path} is not an mmproj file with a vision encoder "
                         f"(general.architecture {arch!r}, llama.cpp's are 'clip')")
    kind = _field(reader, "clip.projector_type") or _field(reader, "clip.vision.projector_type")
    if kind not in GGUF_PROJECTORS:
        raise ValueError(f"mmproj projector type {kind!r} is not supported yet; supported: "
                         f"{sorted(GGUF_PROJECTORS)}")
    return _resolve(GGUF_PROJECTORS[kind])(reader, device, dtype)


def _from_folder(folder: str, device: torch.device, dtype: torch.dtype):
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    if "vision_config" not in config:
        return None
    archs = config.get("architectures") or []
    known = [a for a in archs if a in HF_ARCHITECTURES]
    if not known:
        # NOTE: a text model this engine serves may ship a tower we do not run yet (Qwen3.5):
        # it keeps serving text; images to it are refused at the API for want of a processor
        logger.warning("the vision tower of %s (%s) is not supported yet; serving text only "
                       "(supported: %s)", folder, archs, sorted(HF_ARCHITECTURES))
        return None
    return _resolve(HF_ARCHITECTURES[known[0]])(config, folder, device, dtype)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


# -- Gemma 3 ----------------------------------------------------------------------------------

def _gemma3_from_hf(config: dict, folder: str, device: torch.device, dtype: torch.dtype):
    from radixserve.models.vision.gemma3 import Gemma3VisionEncoder

    v = config["vision_config"]
    siglip = SiglipConfig(
        hidden_size=v.get("hidden_size", 768), intermediate_size=v.get("intermediate_size", 3072),
        num_layers=v.get("num_hidden_layers", 12), num_heads=v.get("num_attention_heads", 12),
        image_size=v.get("image_size", 224), patch_size=v.get("patch_size", 16),
        layer_norm_eps=v.get("layer_norm_eps", 1e-6), num_channels=v.get("num_channels", 3))
    return Gemma3VisionEncoder(siglip, config.get("mm_tokens_per_image", 256), HfWeights(folder),
                               device, dtype)


def _gemma3_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    from radixserve.models.vision.gemma3 import Gemma3VisionEncoder

    def need(key: str):
        value = _field(reader, key)
        if value is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return value

    siglip = SiglipConfig(
        hidden_size=need("clip.vision.embedding_length"),
        intermediate_size=need("clip.vision.feed_forward_length"),
        num_layers=need("clip.vision.block_count"),
        num_heads=need("clip.vision.attention.head_count"),
        image_size=need("clip.vision.image_size"), patch_size=need("clip.vision.patch_size"),
        layer_norm_eps=_field(reader, "clip.vision.attention.layer_norm_epsilon", 1e-6))
    # llama.cpp's default pools 4 x 4 patches (64 x 64 → 16 x 16); the converter writes the
    # factor only where it differs
    scale = _field(reader, "clip.vision.projector.scale_factor", 4)
    tokens = (siglip.patches_per_side // scale) ** 2
    return Gemma3VisionEncoder(siglip, tokens, GgufWeights(reader), device, dtype)
