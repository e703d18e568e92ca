"""Gemma 2 / 3 shapes from a Hugging Face config.json or GGUF metadata, and their GGUF tensor
names (llama.cpp's: ``ffn_norm`` is Gemma's pre-feedforward norm, not Llama's post-attention
one).

Which layers slide: config.json's ``layer_types`` where given, else the pattern transformers
derives (Gemma 2: every other layer from the first; Gemma 3: ``sliding_window_pattern``, default
6: five sliding, then one global). GGUF files carry only the window, so the pattern is the one
llama.cpp hard-codes (the same two). The query scale follows llama.cpp for GGUF files
(``head_dim ** -0.5``, the 27B models ``(hidden / heads) ** -0.5``), which is what their
config.json's ``query_pre_attn_scalar`` says.

A ``Gemma3ForConditionalGeneration`` folder (every Gemma 3 release of 4B and up) runs its
``text_config`` here; its config.json names only what differs from transformers'
``Gemma3TextConfig`` defaults (``_GEMMA3_TEXT_DEFAULTS``), and its vision tower and projector
(``vision_tower.*``, ``multi_modal_projector.*``) are left to the vision side: ``gemma_text_name``
skips them, so they are never read.
"""

from __future__ import annotations

from radixserve.model_config import GemmaParams, ModelConfig

_GEMMA3 = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", *_GEMMA3)
_SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
_SLIDING, _FULL = "sliding_attention", "full_attention"
# transformers' Gemma3TextConfig defaults, which a release's text_config leaves out (gemma-3-4b-it
# names only its widths, layer and head counts, rope scaling and window)
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "tie_word_embeddings": True}
_GEMMA3_THETA, _GEMMA3_LOCAL_THETA = 1_000_000.0, 10_000.0
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")


def is_gemma(architecture: str) -> bool:
    return architecture in GEMMA_ARCHITECTURES


def gemma_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a Gemma 2 / 3 config.json (transformers 4 or 5 layout); for a
    ``Gemma3ForConditionalGeneration`` one, of its text model. ValueError for what does not
    run here."""
    if arch in _GEMMA3:
        cfg = _gemma3_text_config(cfg, arch)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in _SUPPORTED_ACTIVATIONS:
        raise ValueError(f"unsupported Gemma activation {act!r}; supported: "
                         f"{list(_SUPPORTED_ACTIVATIONS)}")
    num_layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types") or _pattern(arch, num_layers,
                                                     cfg.get("sliding_window_pattern"))
    unknown = set(layer_types) - {_SLIDING, _FULL}
    if unknown or len(layer_types) != num_layers:
        raise ValueError(f"unsupported Gemma layer_types {sorted(unknown) or layer_types}; "
                         f"supported: {num_layers} of {[_SLIDING, _FULL]}")
    theta, local_theta, rope_scaling = _rope(cfg, arch)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 8192),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True),
        attention_bias=cfg.get("attention_bias", False),
        qk_norm=arch in _GEMMA3,
        sliding_window=cfg.get("sliding_window"),
        sliding_layers=tuple(t == _SLIDING for t in layer_types),
        gemma=GemmaParams(
            rope_local_theta=float(local_theta),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or head_dim),
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
            final_logit_softcapping=cfg.get("final_logit_softcapping")),
    )


def _rope(cfg: dict, arch: str) -> tuple[float, float, dict | None]:
    """(global layers' base, sliding layers' base, the global layers' rope scaling or None)
    from either transformers layout; the scaling without its base (that is ``rope_theta``)."""
    rope = cfg.get("rope_parameters") or {}
    if _FULL in rope or _SLIDING in rope:  # transformers 5, Gemma 3: one dict per layer type
        global_rope, local_rope = rope.get(_FULL) or {}, rope.get(_SLIDING) or {}
    else:
        global_rope = dict(rope, **(cfg.get("rope_scaling") or {}))
        local_rope = {"rope_theta": cfg.get("rope_local_base_freq")}
    theta = (global_rope.get("rope_theta") or cfg.get("rope_theta")
             or (_GEMMA3_THETA if arch in _GEMMA3 else 10000.0))
    local_theta = (local_rope.get("rope_theta") or cfg.get("rope_local_base_freq")
                   or (_GEMMA3_LOCAL_THETA if arch in _GEMMA3 else theta))
    rope_type = global_rope.get("rope_type", global_rope.get("type", "default"))
    if rope_type == "default":
        return theta, local_theta, None
    scaling = {k: v for k, v in global_rope.items() if k not in ("rope_theta", "type")}
    return theta, local_theta, dict(scaling, rope_type=rope_type)


def _gemma3_text_config(cfg: dict, arch: str) -> dict:
    """The Gemma 3 text model's config.json fields, transformers' defaults filled in (a
    ConditionalGeneration folder: its ``text_config``). ValueError for a text model that is
    not a causal ``gemma3_text`` decoder."""
    if arch == "Gemma3ForConditionalGeneration":
        cfg = cfg.get("text_config") or {}
        kind = cfg.get("model_type", "gemma3_text")
        if kind != "gemma3_text":
            raise ValueError(f"unsupported Gemma 3 text model {kind!r}; supported: "
                             "['gemma3_text']")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("Gemma 3 with bidirectional attention over all tokens (an embedding "
                         "model) is not a causal decoder; not supported")
    return {**_GEMMA3_TEXT_DEFAULTS, **cfg}


def gemma_text_name(name: str) -> str | None:
    """A folder's tensor name → the text model's: a ConditionalGeneration folder's
    ``language_model.model.*`` / ``language_model.lm_head.*`` (transformers 4.5x) and
    ``model.language_model.*`` (5.x) lose ``language_model.``; its vision tower and projector
    → None (skipped, not read). A text-only folder's names pass as they are."""
    bare = name.removeprefix("model.")
    if bare.startswith(_VISION_PREFIXES):
        return None
    return name.replace("language_model.", "", 1)


def _pattern(arch: str, num_layers: int, every: int | None) -> list[str]:
    """transformers' (and llama.cpp's) default: layer i slides unless (i + 1) % every == 0."""
    every = every or (2 if arch == "Gemma2ForCausalLM" else 6)
    return [_SLIDING if (i + 1) % every else _FULL for i in range(num_layers)]


def gemma_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``gemma2`` / ``gemma3`` GGUF file; ``field(reader, key, default)``
    reads one metadata value."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    hidden, heads, num_layers = (get("embedding_length"), get("attention.head_count"),
                                 get("block_count"))
    head_dim = get("attention.key_length", hidden // heads)
    big = num_layers == (46 if gguf_arch == "gemma2" else 62)  # the 27B models (llama.cpp)
    rope_scaling = None
    if get("rope.scaling.type") == "linear":
        rope_scaling = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    theta = get("rope.freq_base", 10000.0)
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        intermediate_size=get("feed_forward_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=get("context_length", 8192),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        sliding_window=get("attention.sliding_window"),
        sliding_layers=tuple(t == _SLIDING for t in _pattern(arch, num_layers, None)),
        gemma=GemmaParams(
            rope_local_theta=(get("rope.freq_base_swa", _GEMMA3_LOCAL_THETA)
                              if gguf_arch == "gemma3" else theta),
            query_pre_attn_scalar=float(hidden // heads if big else head_dim),
            attn_logit_softcapping=get("attn_logit_softcapping"),
            final_logit_softcapping=get("final_logit_softcapping")),
    )


_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
GGUF_NORM_SUFFIX = "gguf_weight"  # a norm as llama.cpp stores it: 1 + w already


def gemma_hf_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name of a Gemma file → HF name (no ``model.`` prefix). Norm weights,
    which llama.cpp's converter stores as 1 + w, are named ``<norm>.gguf_weight`` so the model
    takes them as they are. ValueError for a tensor Gemma does not have."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _GGUF_LAYER_NAMES:
        base = _GGUF_LAYER_NAMES[parts[2]]
        prefix = f"layers.{parts[1]}.{base}"
    elif len(parts) == 2 and parts[0] in _GGUF_TOP_NAMES:
        base = prefix = _GGUF_TOP_NAMES[parts[0]]
    else:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a Gemma model")
    is_norm = base.endswith("norm") and parts[-1] == "weight"
    return f"{prefix}.{GGUF_NORM_SUFFIX if is_norm else parts[-1]}"
