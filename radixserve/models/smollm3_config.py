"""SmolLM3 shapes from a config.json or a ``smollm3`` GGUF file: Llama with no rope on some
layers (NoPE).

Which layers skip rope: config.json's ``no_rope_layers`` (1: the layer uses rope, 0: NoPE),
else transformers' rule from ``no_rope_layer_interval`` (default 4: layers 3, 7, 11, ...).
llama.cpp's converter records neither; llama.cpp hard-codes the interval 4, and so do GGUF
files here. A window applies (config.json only, as transformers does) where
``use_sliding_window`` and ``sliding_window`` are set, on the ``sliding_attention`` layers of
``layer_types`` (transformers' default: the NoPE layers).
"""

from __future__ import annotations

from radixserve.model_config import LayerRope, ModelConfig
from radixserve.models.decoder_fields import gguf_decoder_fields, hf_decoder_fields
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields

SMOLLM3_ARCHITECTURES = ("SmolLM3ForCausalLM",)
_NOPE_INTERVAL = 4  # transformers' default no_rope_layer_interval, llama.cpp's only one
_DEFAULT_THETA = 2000000.0  # SmolLM3Config.default_theta
_SLIDING, _FULL = "sliding_attention", "full_attention"


def smollm3_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a SmolLM3 config.json. ValueError for attention biases (the o
    projection's would be lost) or a ``no_rope_layers`` / ``layer_types`` shorter than the
    model."""
    if cfg.get("attention_bias"):
        raise ValueError("SmolLM3 with attention_bias is not supported")
    num_layers = cfg["num_hidden_layers"]
    interval = cfg.get("no_rope_layer_interval") or _NOPE_INTERVAL
    uses_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0)
                                              for i in range(num_layers)]
    if len(uses_rope) < num_layers:
        raise ValueError(f"no_rope_layers has {len(uses_rope)} entries for {num_layers} layers")
    no_rope = tuple(i for i in range(num_layers) if not uses_rope[i])
    params = cfg.get("rope_parameters") or {}
    if cfg.get("rope_theta") is None and params.get("rope_theta") is None:
        cfg = dict(cfg, rope_theta=_DEFAULT_THETA)
    return ModelConfig(architecture=arch, **hf_decoder_fields(cfg),
                       **_hf_window(cfg, no_rope), **hf_rope_fields(cfg, arch),
                       layer_rope=LayerRope(no_rope=no_rope) if no_rope else None)


def _hf_window(cfg: dict, no_rope: tuple[int, ...]) -> dict:
    window = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window") or not window:
        return {"sliding_window": None, "sliding_layers": None}
    num_layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [_SLIDING if i in no_rope else _FULL
                                       for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {_SLIDING, _FULL}:
        raise ValueError(f"unsupported layer_types {types}; supported: {num_layers} of "
                         f"{[_SLIDING, _FULL]}")
    return {"sliding_window": window, "sliding_layers": tuple(t == _SLIDING for t in types)}


def smollm3_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``smollm3`` GGUF file (``field(reader, key, default)`` reads one
    metadata value): every fourth layer NoPE, as llama.cpp runs it."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    fields = gguf_decoder_fields(reader, get)
    num_layers = fields["num_layers"]
    no_rope = tuple(i for i in range(num_layers) if (i + 1) % _NOPE_INTERVAL == 0)
    rope = gguf_rope_fields(lambda key, default=None: field(reader, key, default),
                            {t.name: t for t in reader.tensors}, gguf_arch, fields["head_dim"],
                            fields["max_position_embeddings"])
    return ModelConfig(architecture=arch, **fields, **rope,
                       layer_rope=LayerRope(no_rope=no_rope) if no_rope else None)
