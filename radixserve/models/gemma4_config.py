"""Gemma 4 (text) shapes from a Hugging Face config.json: a ``Gemma4ForCausalLM`` folder or the
``text_config`` of a ``Gemma4ForConditionalGeneration`` one (the vision and audio towers are
skipped: not run here). What Gemma 4 adds to Gemma 3's layout (models/gemma4.py runs it):

- global layers with heads of their own width (``global_head_dim``, 512 in the releases;
  transformers 5 saves it as ``per_layer_config``) and, where ``attention_k_eq_v``, their own
  KV head count (``num_global_key_value_heads``) and values taken from the key projection;
- shared-KV layers: the last ``num_kv_shared_layers`` layers attend over the KV of the last
  earlier layer of their kind (``ModelConfig.kv_source``) and hold no pool layer;
- per-layer embeddings (E2B / E4B: ``hidden_size_per_layer_input`` > 0);
- proportional rope on the global layers: the first ``partial_rotary_factor`` of each head's
  frequency pairs rotate (at ``theta ** (-2i / head_dim)``), the rest stay put; it is the
  ``freq_factors`` rope with factor ``inf`` (a zero frequency) on the pairs that stay;
- plain RMSNorm weights (w, not Gemma 3's 1 + w), a scale-free norm on the values, attention
  scale 1, a per-layer output scalar, a final logit soft-cap.

The 26B-A4B MoE (``enable_moe_block``): routed experts beside each dense MLP
(models/gemma4_moe.py).
"""

from __future__ import annotations

from radixserve.model_config import Gemma4Params, ModelConfig

GEMMA4_ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
_TEXT_MODELS = ("gemma4_text", "gemma4")
_SLIDING, _FULL = "sliding_attention", "full_attention"
_SKIPPED = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector")


def gemma4_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a Gemma 4 config.json; ValueError for what does not run here."""
    text = cfg.get("text_config") or cfg
    if text.get("model_type", "gemma4_text") not in _TEXT_MODELS:
        raise ValueError(f"unsupported Gemma 4 text model {text.get('model_type')!r}; "
                         f"supported: {list(_TEXT_MODELS)}")
    num_experts = text.get("num_experts") or 0 if text.get("enable_moe_block") else 0
    top_k = text.get("top_k_experts") or 0
    if text.get("enable_moe_block") and not num_experts:
        raise ValueError("Gemma 4 MoE (enable_moe_block) needs num_experts")
    if num_experts and not 1 <= top_k <= num_experts:
        raise ValueError(f"Gemma 4 MoE: top_k_experts must be in 1..{num_experts}, got {top_k}")
    if text.get("use_bidirectional_attention") == "all":
        raise ValueError("Gemma 4 with bidirectional attention over all tokens is not a "
                         "causal decoder; not supported")
    act = text.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma 4 activation {act!r}; supported: "
                         "['gelu_pytorch_tanh']")
    num_layers = text["num_hidden_layers"]
    layer_types = list(text.get("layer_types") or [
        _SLIDING if (i + 1) % 6 else _FULL for i in range(num_layers)])
    layer_types[-1] = _FULL  # as transformers forces it
    if set(layer_types) - {_SLIDING, _FULL} or len(layer_types) != num_layers:
        raise ValueError(f"unsupported Gemma 4 layer_types {layer_types}; supported: "
                         f"{num_layers} of {[_SLIDING, _FULL]}")
    heads, kv_heads = text["num_attention_heads"], text.get("num_key_value_heads", 1)
    head_dim, k_eq_v = text.get("head_dim", 256), bool(text.get("attention_k_eq_v"))
    shapes = _kv_shapes(text, layer_types, kv_heads, head_dim, k_eq_v)
    for layer, (n, _) in enumerate(shapes):
        if heads % n:
            raise ValueError(f"Gemma 4 layer {layer}: {heads} query heads over {n} KV heads")
    sources = kv_sources(layer_types, text.get("num_kv_shared_layers", 0))
    shared = tuple(i for i, s in enumerate(sources) if s != i)
    rope = text.get("rope_parameters") or {}
    local, full = rope.get(_SLIDING) or {}, rope.get(_FULL) or {}
    if full.get("rope_type", "proportional") not in ("proportional", "default"):
        raise ValueError(f"unsupported Gemma 4 global rope {full.get('rope_type')!r}; "
                         "supported: ['proportional', 'default']")
    per_layer_dim = text.get("hidden_size_per_layer_input") or 0
    return ModelConfig(
        architecture=arch,
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=text["intermediate_size"],
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        max_position_embeddings=text.get("max_position_embeddings", 131072),
        tie_word_embeddings=cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True)),
        attention_bias=text.get("attention_bias", False),
        qk_norm=True,
        sliding_window=text.get("sliding_window", 512),
        sliding_layers=tuple(t == _SLIDING for t in layer_types),
        kv_source=sources if shared else None,
        kv_shapes=tuple(shapes),
        gemma4=Gemma4Params(
            rope_local_theta=float(local.get("rope_theta", 10000.0)),
            global_rope_theta=float(full.get("rope_theta", 1e6)),
            global_rope_fraction=_rope_fraction(full),
            global_rope_factor=float(full.get("factor", 1.0)),
            final_logit_softcapping=text.get("final_logit_softcapping"),
            per_layer_dim=per_layer_dim,
            per_layer_vocab=text.get("vocab_size_per_layer_input", text["vocab_size"]),
            double_wide_layers=shared if text.get("use_double_wide_mlp") else (),
            k_eq_v_layers=tuple(i for i, t in enumerate(layer_types)
                                if k_eq_v and t == _FULL),
            num_experts=num_experts,
            top_k_experts=top_k if num_experts else 0,
            moe_intermediate_size=(text.get("moe_intermediate_size") or 0) if num_experts else 0,
            pad_token_id=text.get("pad_token_id") or 0,
            vision_bidirectional=text.get("use_bidirectional_attention") == "vision"),
    )


def _rope_fraction(full: dict) -> float:
    """The rotated share of a global head: transformers' default (no ``rope_parameters``) is
    proportional rope on a quarter; a ``default`` rope rotates all of it."""
    if not full:
        return 0.25
    if full.get("rope_type", "proportional") == "default":
        return 1.0
    return float(full.get("partial_rotary_factor", 1.0))


def _kv_shapes(text: dict, layer_types: list[str], kv_heads: int, head_dim: int,
               k_eq_v: bool) -> list[tuple[int, int]]:
    """Per layer (KV heads, head dim): config.json's ``per_layer_config`` where saved
    (transformers 5), else the global layers' ``global_head_dim`` and, with
    ``attention_k_eq_v``, ``num_global_key_value_heads``."""
    saved = text.get("per_layer_config")
    if saved is not None and not isinstance(saved, dict):
        raise ValueError("Gemma 4 per_layer_config must map layer indices to overrides")
    global_kv = (text.get("num_global_key_value_heads") if k_eq_v else None) or kv_heads
    out = []
    for i, kind in enumerate(layer_types):
        if saved is not None:
            over = saved.get(str(i)) or saved.get(i) or {}
            out.append((over.get("num_key_value_heads", kv_heads),
                        over.get("head_dim", head_dim)))
        elif kind == _FULL:
            out.append((global_kv, text.get("global_head_dim", 512)))
        else:
            out.append((kv_heads, head_dim))
    return out


def kv_sources(layer_types: list[str], num_shared: int) -> tuple[int, ...]:
    """Per layer, the layer whose KV it attends over: itself, or for the last ``num_shared``
    layers the last earlier unshared layer of its kind (transformers' ``kv_sharing_modes``)."""
    first_shared = len(layer_types) - num_shared
    if not 0 <= num_shared < len(layer_types):
        raise ValueError(f"num_kv_shared_layers {num_shared} must be below the "
                         f"{len(layer_types)} layers")
    last = {kind: i for i, kind in enumerate(layer_types[:first_shared])}
    if num_shared and set(layer_types[first_shared:]) - set(last):
        raise ValueError("a Gemma 4 shared-KV layer has no earlier layer of its kind")
    return tuple(i if i < first_shared else last[kind] for i, kind in enumerate(layer_types))


def gemma4_hf_name(name: str) -> str | None:
    """A folder's tensor name → the text model's (a ConditionalGeneration folder's
    ``model.language_model.*``); the vision / audio towers and their projections → None."""
    if any(part in name for part in _SKIPPED):
        return None
    return name.replace("language_model.", "")
