"""OLMo 2 and OLMo 3 shapes from a config.json or an ``olmo2`` GGUF file (llama.cpp's converter
writes both as ``olmo2``; an OLMo 3 file is the one with a sliding window), and the GGUF
tensor names.

OLMo 3 slides its window on the ``sliding_attention`` layers of ``layer_types`` (transformers'
default, and llama.cpp's without ``sliding_window_pattern``: three sliding, then one full).
Its rope: the full layers take ``rope_theta`` and the rope scaling (yarn in the releases), the
sliding layers a plain rope (transformers 5 config.json: ``rope_parameters`` per layer type;
llama.cpp: ``rope.freq_base_swa``, else the same base, no scaling) → ``LayerRope.sliding_theta``.
The q / k norms are over the whole q / k width (``ModelConfig.qk_norm``; models/olmo2.py).
"""

from __future__ import annotations

from radixserve.model_config import LayerRope, ModelConfig
from radixserve.models.decoder_fields import gguf_decoder_fields, hf_decoder_fields
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields

OLMO_ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
_SLIDING, _FULL = "sliding_attention", "full_attention"
_DEFAULT_THETA = {"Olmo2ForCausalLM": 10000.0, "Olmo3ForCausalLM": 500000.0}


def olmo_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of an OLMo 2 / 3 config.json (transformers 4 or 5 layout). ValueError for
    attention biases or ``layer_types`` that are not one known type per layer."""
    if cfg.get("attention_bias"):
        raise ValueError(f"{arch} with attention_bias is not supported")
    num_layers = cfg["num_hidden_layers"]
    params = cfg.get("rope_parameters") or {}
    full = dict(params.get(_FULL) or params)  # transformers 5: one dict per layer type
    full.setdefault("rope_theta", cfg.get("rope_theta") or _DEFAULT_THETA[arch])
    rope = hf_rope_fields({**cfg, "rope_parameters": full, "rope_theta": None}, arch)
    window, sliding_layers = None, None
    if arch == "Olmo3ForCausalLM" and cfg.get("sliding_window"):
        types = cfg.get("layer_types") or _default_types(num_layers)
        if len(types) != num_layers or set(types) - {_SLIDING, _FULL}:
            raise ValueError(f"unsupported layer_types {types}; supported: {num_layers} of "
                             f"{[_SLIDING, _FULL]}")
        window, sliding_layers = cfg["sliding_window"], tuple(t == _SLIDING for t in types)
    sliding_theta = (params.get(_SLIDING) or {}).get("rope_theta") or rope["rope_theta"]
    fields = dict(hf_decoder_fields(cfg), rms_norm_eps=cfg.get("rms_norm_eps", 1e-5))
    return ModelConfig(architecture=arch, **fields, **rope, qk_norm=True,
                       sliding_window=window, sliding_layers=sliding_layers,
                       layer_rope=_layer_rope(window, rope, sliding_theta))


def _default_types(num_layers: int) -> list[str]:
    return [_SLIDING if (i + 1) % 4 else _FULL for i in range(num_layers)]


def _layer_rope(window: int | None, rope: dict, sliding_theta: float) -> LayerRope | None:
    """The sliding layers' own rope where it differs from the full layers' (a scaling or
    another base)."""
    if window is None or (rope["rope_scaling"] is None and sliding_theta == rope["rope_theta"]):
        return None
    return LayerRope(sliding_theta=float(sliding_theta))


def olmo_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of an ``olmo2`` GGUF file (``field(reader, key, default)`` reads one
    metadata value): OLMo 3 where it has a sliding window."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    fields = gguf_decoder_fields(reader, get)
    num_layers = fields["num_layers"]
    rope = gguf_rope_fields(lambda key, default=None: field(reader, key, default),
                            {t.name: t for t in reader.tensors}, gguf_arch, fields["head_dim"],
                            fields["max_position_embeddings"])
    window = get("attention.sliding_window") or None
    sliding_layers = None
    if window is not None:
        pattern = get("attention.sliding_window_pattern")
        sliding_layers = (tuple(bool(p) for p in pattern) if pattern is not None
                          else tuple(t == _SLIDING for t in _default_types(num_layers)))
    return ModelConfig(architecture="Olmo3ForCausalLM" if window else arch, **fields, **rope,
                       qk_norm=True, sliding_window=window, sliding_layers=sliding_layers,
                       layer_rope=_layer_rope(window, rope,
                                              get("rope.freq_base_swa") or rope["rope_theta"]))


_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def olmo_hf_name(gguf_name: str) -> str:
    """llama.cpp tensor name of an OLMo file → HF name (no ``model.`` prefix). ValueError for
    a tensor OLMo does not have."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _GGUF_LAYER_NAMES:
        return f"layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GGUF_TOP_NAMES:
        return f"{_GGUF_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for an OLMo model")
