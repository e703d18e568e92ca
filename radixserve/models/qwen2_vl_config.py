"""Qwen2.5-VL's text model (``Qwen2_5_VLForConditionalGeneration`` folders, ``qwen2vl`` GGUF
files): a Qwen2 decoder (q, k, v biases) whose rope turns by three positions (mRoPE: time,
height, width; ``ModelConfig.mrope``, sections in order). For text the three are the token's
index: plain rope; an image's rows take their grid (the engine places them).

A release's config.json is flat (the text fields at the top, ``rope_scaling`` ``{"type":
"mrope", "mrope_section": [16, 24, 24]}``, tensors ``model.*`` / ``lm_head`` beside the tower's
``visual.*``); transformers 5 saves ``text_config`` (``rope_parameters`` with the sections) and
``model.language_model.*`` beside ``model.visual.*``. The tower is the vision encoder's
(models/vision/qwen2_5_vl.py) and skipped here. llama.cpp's converter writes the text model as
``qwen2vl`` with ``qwen2vl.rope.dimension_sections`` (padded to four with zeros).
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig, MRopeParams
from radixserve.models.decoder_fields import gguf_decoder_fields, hf_decoder_fields
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields

QWEN2_VL_ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration",)
_SKIPPED = ("visual.", "model.visual.")
_DEFAULT_THETA = 1_000_000.0  # Qwen2_5_VLTextConfig.default_theta
_MROPE_KEYS = ("type", "rope_type", "mrope_section", "mrope_interleaved")


def qwen2_vl_mrope(sections, head_dim: int) -> MRopeParams:
    """The in-order mRoPE of ``sections`` (trailing zeros dropped: a GGUF pads to four).
    ValueError where they do not cover the head's rotary half."""
    sections = [int(s) for s in sections]
    while sections and sections[-1] == 0:
        sections.pop()
    if not sections or sum(sections) != head_dim // 2:
        raise ValueError(f"mrope sections {sections} must sum to half the head ({head_dim // 2})")
    return MRopeParams(tuple(sections), interleaved=False)


def qwen2_vl_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a Qwen2.5-VL config.json's text model. ValueError for a rope other
    than mRoPE over default frequencies, missing sections, or sliding-window layers."""
    text = cfg.get("text_config")
    text = {**cfg, **text} if isinstance(text, dict) else dict(cfg)
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    # releases say {"type": "mrope"} (some later {"type": "default", "rope_type": "default"}),
    # transformers 5 {"rope_type": "default", "type": "mrope"}: all mean mRoPE, plain frequencies
    other = {rope.get("rope_type"), rope.get("type")} - {None, "default", "mrope"}
    if other:
        raise ValueError(f"unsupported Qwen2.5-VL rope type {min(other)!r}; supported: "
                         "['mrope']")
    if "mrope_section" not in rope:
        raise ValueError("a Qwen2.5-VL config.json needs rope_scaling.mrope_section")
    if text.get("use_sliding_window"):
        raise ValueError("Qwen2.5-VL with use_sliding_window is not supported")
    theta = text.get("rope_theta") or rope.get("rope_theta") or _DEFAULT_THETA
    plain = {**text, "rope_scaling": None, "rope_parameters": {"rope_theta": theta}}
    fields = hf_decoder_fields(plain)
    # the head's tie is the top-level config's where it says (what transformers ties by)
    fields["tie_word_embeddings"] = cfg.get("tie_word_embeddings",
                                            fields["tie_word_embeddings"])
    return ModelConfig(architecture=arch, **fields, **hf_rope_fields(plain, arch),
                       attention_bias=True,
                       mrope=qwen2_vl_mrope(rope["mrope_section"], fields["head_dim"]))


def qwen2_vl_hf_name(name: str) -> str | None:
    """A folder's tensor name → the Qwen2 model's (``model.language_model.X`` → ``model.X``;
    releases' ``model.X`` and ``lm_head.weight`` as they are); the tower's → None (skipped)."""
    if name.startswith(_SKIPPED):
        return None
    return name.replace("model.language_model.", "model.", 1)


def qwen2_vl_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``qwen2vl`` GGUF file (``field(reader, key, default)`` reads one
    metadata value). ValueError without ``rope.dimension_sections``."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    fields = gguf_decoder_fields(reader, get)
    sections = get("rope.dimension_sections")
    if sections is None:
        raise ValueError(f"a {gguf_arch} GGUF needs {gguf_arch}.rope.dimension_sections")
    tensors = {t.name: t for t in reader.tensors}
    rope = gguf_rope_fields(lambda key, default=None: field(reader, key, default), tensors,
                            gguf_arch, fields["head_dim"], fields["max_position_embeddings"])
    return ModelConfig(architecture=arch, **fields, **rope,
                       attention_bias="blk.0.attn_q.bias" in tensors,
                       mrope=qwen2_vl_mrope(sections, fields["head_dim"]))
