"""SmolVLM's vision encoder from a Hugging Face folder or an ``idefics3`` mmproj GGUF: the
builders models/vision/load.py's tables name (``SmolVLMForConditionalGeneration``,
``clip.projector_type`` idefics3).

A folder's ``vision_config`` leaves out what transformers' ``SmolVLMVisionConfig`` defaults
(SmolVLM2 releases omit the widths), so those defaults fill it; ``scale_factor`` is the
top-level config's. llama.cpp's converter writes the same shape as ``clip.vision.*`` keys and
the pixel shuffle's factor as ``clip.vision.projector.scale_factor``.
"""

from __future__ import annotations

import torch

from radixserve.models.vision.siglip import SiglipConfig
from radixserve.models.vision.weights import GgufWeights, HfWeights

# transformers' SmolVLMVisionConfig defaults
_VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12,
                    "num_attention_heads": 16, "image_size": 224, "patch_size": 32,
                    "layer_norm_eps": 1e-6, "num_channels": 3}


def smolvlm_from_hf(config: dict, folder: str, device: torch.device, dtype: torch.dtype):
    """The encoder of the SmolVLM ``folder`` (``config``: its config.json). ValueError for
    missing or misshapen weights."""
    from radixserve.models.vision.smolvlm import SmolVLMVisionEncoder

    v = {**_VISION_DEFAULTS, **config["vision_config"]}
    siglip = SiglipConfig(
        hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_layers=v["num_hidden_layers"], num_heads=v["num_attention_heads"],
        image_size=v["image_size"], patch_size=v["patch_size"],
        layer_norm_eps=v["layer_norm_eps"], num_channels=v["num_channels"])
    return SmolVLMVisionEncoder(siglip, int(config.get("scale_factor", 2)), HfWeights(folder),
                                device, dtype)


def smolvlm_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    """The encoder of an ``idefics3`` mmproj GGUF (``reader``: radixserve.gguf_reader's).
    ValueError for missing metadata or tensors."""
    from radixserve.models.vision.smolvlm import SmolVLMVisionEncoder

    def get(key: str, default=None):
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
        if default is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return default

    siglip = SiglipConfig(
        hidden_size=get("clip.vision.embedding_length"),
        intermediate_size=get("clip.vision.feed_forward_length"),
        num_layers=get("clip.vision.block_count"),
        num_heads=get("clip.vision.attention.head_count"),
        image_size=get("clip.vision.image_size"), patch_size=get("clip.vision.patch_size"),
        layer_norm_eps=get("clip.vision.attention.layer_norm_epsilon", 1e-6))
    scale = int(get("clip.vision.projector.scale_factor", 2))
    return SmolVLMVisionEncoder(siglip, scale, GgufWeights(reader), device, dtype)
