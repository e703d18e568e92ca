"""Qwen3-VL's text model (``Qwen3VLForConditionalGeneration`` folders, ``qwen3vl`` GGUF files):
a Qwen3 decoder (q / k RMSNorm, no biases) whose rope turns by three positions (mRoPE: time,
height, width; ``ModelConfig.mrope``, sections interleaved t h w t h w ..., as transformers'
``Qwen3VLTextRotaryEmbedding`` always does). For text the three are the token's index: plain
rope; an image's rows take their grid (the engine places them). Deepstack (the vision
encoder's extra rows added after the first decoder layers) is the engine's: the encoder says
how many (``deepstack_layers``, models/vision/qwen3_vl.py).

A release's config.json nests the text model in ``text_config`` (``rope_scaling``
``{"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}`` and
``rope_theta`` beside it; transformers 5 saves them as ``rope_parameters``) and stores
``model.language_model.*`` and ``lm_head`` beside the tower's ``model.visual.*`` (skipped
here). llama.cpp's converter (conversion/qwen3vl.py ``Qwen3VLTextModel``) writes the text model
as ``qwen3vl``: Qwen3's keys and tensors plus ``qwen3vl.rope.dimension_sections`` (padded to
four with zeros) and ``qwen3vl.n_deepstack_layers``.
"""

from __future__ import annotations

import dataclasses

from radixserve.model_config import ModelConfig
from radixserve.models.decoder_fields import hf_decoder_fields
from radixserve.models.qwen2_vl_config import qwen2_vl_gguf_config, qwen2_vl_mrope
from radixserve.models.rope_config import hf_rope_fields

QWEN3_VL_ARCHITECTURES = ("Qwen3VLForConditionalGeneration",)
_DEFAULT_THETA = 500_000.0  # Qwen3VLTextConfig.default_theta
_DEFAULT_SECTIONS = (24, 20, 20)  # Qwen3VLTextRotaryEmbedding's where config.json has none


def qwen3_vl_mrope(sections, head_dim: int):
    """The interleaved mRoPE of ``sections`` (trailing zeros dropped). ValueError where they
    do not cover the head's rotary half."""
    return dataclasses.replace(qwen2_vl_mrope(sections, head_dim), interleaved=True)


def qwen3_vl_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a Qwen3-VL config.json's text model. ValueError for a rope other
    than mRoPE over default frequencies, or attention biases."""
    text = cfg.get("text_config")
    text = {**cfg, **text} if isinstance(text, dict) else dict(cfg)
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    other = {rope.get("rope_type"), rope.get("type")} - {None, "default", "mrope"}
    if other:
        raise ValueError(f"unsupported Qwen3-VL rope type {min(other)!r}; supported: "
                         "['default'] (with mrope_section)")
    if text.get("attention_bias"):
        raise ValueError("Qwen3-VL with attention_bias is not supported")
    theta = text.get("rope_theta") or rope.get("rope_theta") or _DEFAULT_THETA
    plain = {**text, "rope_scaling": None, "rope_parameters": {"rope_theta": theta}}
    fields = hf_decoder_fields(plain)
    # the head's tie is the top-level config's where it says (what transformers ties by)
    fields["tie_word_embeddings"] = cfg.get("tie_word_embeddings",
                                            fields["tie_word_embeddings"])
    sections = rope.get("mrope_section") or _DEFAULT_SECTIONS
    return ModelConfig(architecture=arch, **fields, **hf_rope_fields(plain, arch),
                       qk_norm=True, mrope=qwen3_vl_mrope(sections, fields["head_dim"]))


def qwen3_vl_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``qwen3vl`` GGUF file (``field(reader, key, default)`` reads one
    metadata value). ValueError without ``rope.dimension_sections``."""
    config = qwen2_vl_gguf_config(reader, field, gguf_arch, arch)
    return dataclasses.replace(
        config, mrope=dataclasses.replace(config.mrope, interleaved=True),
        qk_norm=any(t.name == "blk.0.attn_q_norm.weight" for t in reader.tensors))
