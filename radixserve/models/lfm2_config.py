"""Liquid LFM2 / LFM2.5 shapes (``Lfm2ForCausalLM``, model_type ``lfm2``, llama.cpp's ``lfm2``;
the MoE ``Lfm2MoeForCausalLM``, ``lfm2_moe``, llama.cpp's ``lfm2moe``) from a Hugging Face
config.json or GGUF metadata, and both checkpoints' tensor names as the model class
(models/lfm2.py) names its modules: the Llama ones (``input_layernorm``, ``self_attn.o_proj``,
``mlp.gate_proj``, final ``norm``), the short conv's as transformers has them (``conv.in_proj``,
``conv.conv``, ``conv.out_proj``).

An LFM2 decoder mixes ``conv`` layers (a gated short causal conv: models/lfm2.py) and
``full_attention`` ones (GQA with q/k RMSNorms); where config.json has no ``layer_types``,
transformers makes the layers in ``full_attn_idxs`` attention (default: all of them). A GGUF
file says it per layer: a conv layer is one with ``attention.head_count_kv`` 0.

The dense MLP's width is not ``intermediate_size`` itself where ``block_auto_adjust_ff_dim``
(the default): transformers' ``Lfm2MLP`` takes 2/3 of it, times ``block_ffn_dim_multiplier``,
rounded up to a multiple of ``block_multiple_of`` (the converter writes the result as
``feed_forward_length``). LFM2-MoE's dense layers (the first ``num_dense_layers``) use
``intermediate_size`` as it is.
"""

from __future__ import annotations

from radixserve.model_config import FULL, LINEAR, ModelConfig, MoeConfig
from radixserve.models.moe import GGUF_EXPERT_NAMES, moe_from_gguf
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields
from radixserve.recurrent_params import ShortConvParams

LFM2_ARCHITECTURE = "Lfm2ForCausalLM"
LFM2_MOE_ARCHITECTURE = "Lfm2MoeForCausalLM"
LFM2_ARCHITECTURES = (LFM2_ARCHITECTURE, LFM2_MOE_ARCHITECTURE)
_DEFAULT_THETA = 1000000.0  # transformers' Lfm2Config / Lfm2MoeConfig ``default_theta``
_LAYER_TYPES = {"conv": LINEAR, "full_attention": FULL}
_MOE_DEFAULTS = {  # Lfm2MoeConfig's (LFM2-8B-A1B's)
    "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 1792,
    "num_dense_layers": 2, "use_expert_bias": True, "routed_scaling_factor": 1.0,
    "norm_topk_prob": True}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")


def lfm2_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of an ``Lfm2ForCausalLM`` / ``Lfm2MoeForCausalLM`` config.json (the
    older keys ``block_ff_dim`` and ``tie_embedding`` read as transformers reads them).
    ValueError for what radixserve does not run: conv biases, unknown or miscounted layer
    types, an MoE config without ``layer_types``."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"LFM2 config.json lacks {missing}")
    if cfg.get("conv_bias", False):
        raise ValueError("LFM2 with conv_bias (biases in the short-conv layers) is not "
                         "supported; no released LFM2 checkpoint has them")
    num_layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    is_moe = arch == LFM2_MOE_ARCHITECTURE
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or params.get("rope_theta") or _DEFAULT_THETA
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg["num_key_value_heads"] or heads,
        head_dim=cfg["hidden_size"] // heads,
        intermediate_size=cfg.get("intermediate_size", 7168) if is_moe else _hf_ffn_width(cfg),
        rms_norm_eps=cfg.get("norm_eps", 1e-5),
        max_position_embeddings=cfg.get("max_position_embeddings", 128000),
        tie_word_embeddings=bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))),
        qk_norm=True,
        linear_attn=ShortConvParams(layer_types=_hf_layer_types(cfg, num_layers, is_moe),
                                    conv_dim=cfg["hidden_size"],
                                    conv_kernel=cfg.get("conv_L_cache", 3)),
        moe=_hf_moe(cfg, num_layers) if is_moe else None,
        **hf_rope_fields(dict(cfg, rope_theta=theta), arch),
    )


def _hf_ffn_width(cfg: dict) -> int:
    """transformers' ``Lfm2MLP`` width (see the module docstring)."""
    width = cfg.get("block_ff_dim", cfg.get("intermediate_size", 12288))
    if not cfg.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:  # (transformers rounds only with a multiplier)
        multiple = cfg.get("block_multiple_of", 256)
        width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    return width


def _hf_layer_types(cfg: dict, num_layers: int, is_moe: bool) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if types is None:
        if is_moe:  # (transformers' Lfm2MoeConfig derives none either)
            raise ValueError("LFM2-MoE config.json lacks layer_types")
        full = cfg.get("full_attn_idxs")
        full = range(num_layers) if full is None else full
        types = ["full_attention" if i in full else "conv" for i in range(num_layers)]
    unknown = sorted(set(types) - set(_LAYER_TYPES))
    if unknown:
        raise ValueError(f"unknown LFM2 layer types {unknown}; known: {sorted(_LAYER_TYPES)}")
    if len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
    return tuple(_LAYER_TYPES[t] for t in types)


def _hf_moe(cfg: dict, num_layers: int) -> MoeConfig:
    """transformers' ``Lfm2MoeSparseMoeBlock`` in every layer from ``num_dense_layers`` on:
    sigmoid scores, the top k picked by score + ``expert_bias`` where ``use_expert_bias``,
    their scores renormalized (``norm_topk_prob``) and scaled by ``routed_scaling_factor``."""
    def get(key):
        return cfg.get(key, _MOE_DEFAULTS[key])

    return MoeConfig(get("num_experts"), get("num_experts_per_tok"),
                     get("moe_intermediate_size"), norm_topk_prob=bool(get("norm_topk_prob")),
                     dense_layers=tuple(range(min(get("num_dense_layers"), num_layers))),
                     **_sigmoid_routing(bool(get("use_expert_bias")),
                                        float(get("routed_scaling_factor"))))


def _sigmoid_routing(expert_bias: bool, routed_scaling: float) -> dict:
    """MoeConfig's routing fields for LFM2-MoE's router (transformers' renormalization adds
    1e-6 to the sum)."""
    return {"scoring": "sigmoid", "expert_bias": expert_bias, "routed_scaling": routed_scaling,
            "norm_eps": 1e-6}


def lfm2_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of an ``lfm2`` / ``lfm2moe`` GGUF file (the keys llama.cpp's converter
    writes; ``field(reader, key, default)`` reads one metadata value). A layer is a conv layer
    where its ``attention.head_count_kv`` entry is 0 (a single value: every layer attends)."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    num_layers, hidden = get("block_count"), get("embedding_length")
    heads = get("attention.head_count")
    kv = get("attention.head_count_kv", heads)
    kv = list(kv) if isinstance(kv, list | tuple) else [kv] * num_layers
    if len(kv) != num_layers:
        raise ValueError(f"{gguf_arch}.attention.head_count_kv has {len(kv)} entries for "
                         f"{num_layers} layers")
    head_dim = hidden // heads
    max_positions = get("context_length", 128000)
    moe = _gguf_moe(reader, field, gguf_arch, set(tensors), num_layers)
    if moe is None and arch == LFM2_MOE_ARCHITECTURE:
        raise ValueError(f"this {gguf_arch} GGUF file has no experts "
                         f"({gguf_arch}.expert_count is missing or 0)")
    return ModelConfig(
        architecture=arch,
        vocab_size=get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=max(kv),
        head_dim=head_dim,
        intermediate_size=get("feed_forward_length") or get("expert_feed_forward_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        max_position_embeddings=max_positions,
        tie_word_embeddings="output.weight" not in tensors,
        qk_norm=True,
        linear_attn=ShortConvParams(layer_types=tuple(LINEAR if n == 0 else FULL for n in kv),
                                    conv_dim=hidden, conv_kernel=get("shortconv.l_cache", 3)),
        moe=moe,
        **gguf_rope_fields(lambda key, default=None: field(reader, key, default), tensors,
                           gguf_arch, head_dim, max_positions),
    )


_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def _gguf_moe(reader, field, gguf_arch: str, names: set[str], num_layers: int
              ) -> MoeConfig | None:
    """The experts of an ``lfm2moe`` file: ``moe_from_gguf``'s shape, routed as llama.cpp's
    lfm2moe graph does (sigmoid scores, the bias ``exp_probs_b`` in selection, the top k
    renormalized, ``expert_weights_scale`` where the file has it)."""
    moe = moe_from_gguf(lambda key, default=None: field(reader, key, default), gguf_arch, names,
                        num_layers)
    if moe is None:
        return None
    gating = field(reader, f"{gguf_arch}.expert_gating_func", _SIGMOID)
    if gating != _SIGMOID:
        raise ValueError(f"{gguf_arch}.expert_gating_func {gating}: LFM2-MoE routes by "
                         f"sigmoid ({_SIGMOID})")
    biased = any(n.endswith(".exp_probs_b.bias") for n in names)
    scale = field(reader, f"{gguf_arch}.expert_weights_scale", 0.0) or 1.0  # 0: unset
    return MoeConfig(moe.num_experts, moe.top_k, moe.intermediate_size, norm_topk_prob=True,
                     dense_layers=moe.dense_layers, **_sigmoid_routing(biased, scale))


# -- tensor names -------------------------------------------------------------------------------

_HF_LAYER = {  # transformers' names in a decoder layer → the model's
    "operator_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "self_attn.out_proj": "self_attn.o_proj", "self_attn.q_layernorm": "self_attn.q_norm",
    "self_attn.k_layernorm": "self_attn.k_norm", "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
    "feed_forward.gate": "mlp.gate", "feed_forward.expert_bias": "mlp.expert_bias",
    # transformers 5's fused experts (in memory; some tools save them so)
    "feed_forward.experts.gate_up_proj": "mlp.experts.gate_up_proj",
    "feed_forward.experts.down_proj": "mlp.experts.down_proj",
}
_HF_SAME = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "conv.in_proj",
            "conv.conv", "conv.out_proj")  # named as the model names them
_HF_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_HF_TOP = {"embed_tokens": "embed_tokens", "embedding_norm": "norm", "lm_head": "lm_head"}


def lfm2_hf_name(name: str) -> str:
    """A folder's tensor name → the model's (no ``model.`` prefix). ValueError for a tensor
    an LFM2 decoder does not have."""
    name = name.removeprefix("model.")
    parts = name.split(".")
    if parts[0] in _HF_TOP and len(parts) == 2:
        return f"{_HF_TOP[parts[0]]}.{parts[1]}"
    if parts[0] != "layers" or len(parts) < 4 or not parts[1].isdecimal():
        raise ValueError(f"unexpected tensor {name!r} for an LFM2 model")
    head, rest = ".".join(parts[:2]), ".".join(parts[2:])
    if rest.startswith("feed_forward.experts.") and parts[4].isdecimal():  # experts.E.w1.weight
        expert, kind, suffix = parts[4], parts[5], ".".join(parts[6:])
        if kind in _HF_EXPERT:
            return f"{head}.mlp.experts.{expert}.{_HF_EXPERT[kind]}.{suffix}"
    for old, new in _HF_LAYER.items():
        if rest == old or rest.startswith(old + "."):
            return f"{head}.{new}{rest[len(old):]}"
    if rest.rsplit(".", 1)[0] in _HF_SAME:
        return name
    raise ValueError(f"unexpected tensor {name!r} for an LFM2 model")


_GGUF_LAYER = {  # llama.cpp's names in a block → the model's
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",  # convert_hf_to_gguf.py --fuse-qkv
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "shortconv": "conv",
    "exp_probs_b": "mlp.expert_bias",
    **GGUF_EXPERT_NAMES,
}
_GGUF_TOP = {"token_embd": "embed_tokens", "token_embd_norm": "norm", "output": "lm_head"}


def lfm2_gguf_name(gguf_name: str) -> str:
    """llama.cpp tensor name → the model's: ``token_embd_norm`` is LFM2's final norm
    (llama.cpp's name for transformers' ``embedding_norm``), ``blk.N.shortconv.*`` the conv
    layer's, ``blk.N.exp_probs_b.bias`` the router's expert bias. ValueError for anything
    else."""
    parts = gguf_name.split(".")
    if parts[0] in _GGUF_TOP and len(parts) == 2:
        return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"
    if parts[0] == "blk" and len(parts) >= 4 and parts[1].isdecimal() and parts[2] in _GGUF_LAYER:
        if parts[2] == "exp_probs_b":  # [n_expert] with a ``.bias`` suffix
            return f"layers.{parts[1]}.{_GGUF_LAYER['exp_probs_b']}"
        return f"layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{'.'.join(parts[3:])}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for an LFM2 model")
