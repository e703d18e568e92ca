"""Mistral 3 text decoders (Ministral 3, Mistral Small 3.1 / 3.2) from a config.json (a
``Mistral3ForConditionalGeneration`` folder's ``text_config``, or a text-only
``Ministral3ForCausalLM`` folder) or a ``mistral3`` GGUF file; the vision tower and projector
are skipped (not run here).

The text model is Mistral's Llama layout. Ministral 3 adds yarn rope (``mscale`` /
``mscale_all_dim`` set its attention factor: 1 in the releases) and Llama 4's attention
temperature: queries times ``1 + beta ln(1 + floor(pos / original))`` (models/mistral3.py),
``beta`` = ``llama_4_scaling_beta`` and ``original`` = ``original_max_position_embeddings`` of
the rope parameters; both stay in ``ModelConfig.rope_scaling``, where transformers reads them.
llama.cpp's converter writes them as ``attention.temperature_scale``,
``rope.scaling.yarn_log_multiplier`` (``mscale_all_dim``; ``mscale`` taken as 1, as llama.cpp
does) and the yarn keys.
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig
from radixserve.models.decoder_fields import gguf_decoder_fields, hf_decoder_fields
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields

MISTRAL3_ARCHITECTURES = ("Mistral3ForConditionalGeneration", "Ministral3ForCausalLM")
_TEXT_MODELS = ("ministral3", "mistral")
TEMPERATURE_KEY = "llama_4_scaling_beta"
# what the rope and the temperature read of transformers' rope parameters (the rest, such as
# its copy of max_position_embeddings, is dropped so config.json and GGUF compare equal)
_ROPE_KEYS = ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
              TEMPERATURE_KEY)
_SKIPPED = ("vision_tower.", "multi_modal_projector.")


def mistral3_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of the text model of a Mistral 3 config.json. ValueError for a text
    model other than ``ministral3`` / ``mistral``."""
    text = cfg.get("text_config") or cfg
    kind = text.get("model_type", "ministral3")
    if kind not in _TEXT_MODELS:
        raise ValueError(f"unsupported Mistral 3 text model {kind!r}; supported: "
                         f"{list(_TEXT_MODELS)}")
    rope = hf_rope_fields(text, arch)
    if rope["rope_scaling"] is not None:
        rope["rope_scaling"] = {k: v for k, v in rope["rope_scaling"].items() if k in _ROPE_KEYS}
    return ModelConfig(architecture=arch, **hf_decoder_fields(text), **rope,
                       sliding_window=text.get("sliding_window") or None)


def mistral3_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``mistral3`` GGUF file (``field(reader, key, default)`` reads one
    metadata value)."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    fields = gguf_decoder_fields(reader, get)
    rope = gguf_rope_fields(lambda key, default=None: field(reader, key, default),
                            {t.name: t for t in reader.tensors}, gguf_arch, fields["head_dim"],
                            fields["max_position_embeddings"])
    scaling = rope["rope_scaling"]
    if scaling is not None and (log_mul := get("rope.scaling.yarn_log_multiplier")) is not None:
        scaling.update(mscale=1.0, mscale_all_dim=log_mul)
    if scaling is not None and (beta := get("attention.temperature_scale")) is not None:
        scaling[TEMPERATURE_KEY] = beta
    return ModelConfig(architecture=arch, **fields, **rope,
                       sliding_window=get("attention.sliding_window") or None)


def mistral3_hf_name(name: str) -> str | None:
    """A folder's tensor name → the text model's (transformers 5: ``model.language_model.*``,
    4: ``language_model.model.*`` and ``language_model.lm_head``); the vision tower and the
    projector → None (skipped)."""
    if any(part in name for part in _SKIPPED):
        return None
    return name.replace("language_model.", "")
