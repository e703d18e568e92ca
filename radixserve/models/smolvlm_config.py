"""SmolVLM's text model (``SmolVLMForConditionalGeneration`` folders): a Llama decoder read from
the config.json's ``text_config`` and the ``model.text_model.*`` / ``lm_head`` tensors; the
vision tower (``model.vision_model.*``) and the connector (``model.connector.*``) are the
vision encoder's (models/vision/smolvlm.py) and skipped here. llama.cpp's converter writes the
text model as a plain ``llama`` GGUF, which loads as any Llama file.
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig
from radixserve.models.decoder_fields import hf_decoder_fields
from radixserve.models.rope_config import hf_rope_fields

SMOLVLM_ARCHITECTURES = ("SmolVLMForConditionalGeneration",)
_TEXT_MODELS = ("llama",)
_SKIPPED = ("model.vision_model.", "model.connector.")
# transformers' LlamaConfig defaults: SmolVLM2 releases leave num_attention_heads out of their
# text_config (llama.cpp's converter fills the same 32)
_LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 32, "num_attention_heads": 32}


def smolvlm_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a SmolVLM config.json's text model. ValueError for a missing
    ``text_config`` or a text model that is not a Llama."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"a {arch} config.json needs a text_config object")  # noqa: TRY004
    kind = text.get("model_type", "llama")
    if kind not in _TEXT_MODELS:
        raise ValueError(f"unsupported SmolVLM text model {kind!r}; supported: "
                         f"{list(_TEXT_MODELS)}")
    text = {**_LLAMA_DEFAULTS, **text}
    fields = hf_decoder_fields(text)
    # the head's tie is the top-level config's where it says (what transformers ties by)
    fields["tie_word_embeddings"] = cfg.get("tie_word_embeddings",
                                            fields["tie_word_embeddings"])
    return ModelConfig(architecture=arch, **fields, **hf_rope_fields(text, arch),
                       attention_bias=bool(text.get("attention_bias", False)))


def smolvlm_hf_name(name: str) -> str | None:
    """A folder's tensor name → the Llama model's (``model.text_model.X`` → ``model.X``,
    ``lm_head.weight`` as it is); the vision tower's and the connector's → None (skipped)."""
    if name.startswith(_SKIPPED):
        return None
    return name.replace("model.text_model.", "model.", 1)
