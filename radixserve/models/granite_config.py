"""IBM Granite shapes from a Hugging Face config.json or GGUF metadata, and a Granite folder's
tensor names as the model takes them (a GGUF file's are in granite_gguf.py).

One model class (models/granite.py) runs four checkpoint kinds:

- ``GraniteForCausalLM`` (Granite 3.x; llama.cpp's ``granite``): Llama with four multipliers;
- ``GraniteMoeForCausalLM`` / ``GraniteMoeSharedForCausalLM`` (``granitemoe``): its MLPs sparse
  MoE blocks (softmax router, top-k weights renormalized), the latter with an ungated shared
  SwiGLU expert (``shared_mlp``) added to every token's;
- ``GraniteMoeHybridForCausalLM`` (Granite 4.0-H / 4.1-H; ``granitehybrid``): Mamba2 layers
  (``layer_types`` "mamba") and attention layers ("attention"; transformers 5 writes
  "linear_attention" / "full_attention"), each followed by the shared MLP plus, where
  ``num_local_experts`` > 0, a sparse MoE block. Its attention has no RoPE unless
  ``position_embedding_type`` is "rope" (Granite 4.0-H: "nope"). A folder of this class with
  attention layers only (Granite 4.0-Micro) is a plain decoder (``linear_attn`` None).

The multipliers (model_config.py's ``GraniteParams``): the embeddings times
``embedding_multiplier``; the attention scale is ``attention_multiplier`` (not
1 / sqrt(head_dim)); each block's output times ``residual_multiplier`` before the residual
add; the logits divided by ``logits_scaling``. llama.cpp's converter writes them as
``embedding_scale``, ``attention.scale``, ``residual_scale`` and ``logit_scale``; an absent key
means no scaling (for the attention: 1 / sqrt(head_dim)), as llama.cpp reads them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from radixserve.model_config import FULL, LINEAR, GraniteParams, ModelConfig, MoeConfig
from radixserve.models.moe import moe_from_gguf
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields
from radixserve.recurrent_params import Mamba2Params

GRANITE = "GraniteForCausalLM"
GRANITE_MOE = "GraniteMoeForCausalLM"
GRANITE_MOE_SHARED = "GraniteMoeSharedForCausalLM"
GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"
GRANITE_ARCHITECTURES = (GRANITE, GRANITE_MOE, GRANITE_MOE_SHARED, GRANITE_HYBRID)
_MOE_ARCHITECTURES = (GRANITE_MOE, GRANITE_MOE_SHARED, GRANITE_HYBRID)
# the layer_types names of the Granite 4 releases and of transformers 5
_LAYER_TYPES = {"mamba": LINEAR, "linear_attention": LINEAR,
                "attention": FULL, "full_attention": FULL}
_DEFAULTS = {  # transformers' config defaults, for the fields a config.json omits
    "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "num_local_experts": 8,
    "num_experts_per_tok": 2, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
    "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
    "mamba_proj_bias": False}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def granite_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a Granite config.json (any of ``GRANITE_ARCHITECTURES``).
    ValueError for what radixserve does not run: an activation other than silu, attention or
    MLP biases, unknown or miscounted layer types, inconsistent Mamba2 sizes."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"Granite config.json lacks {missing}")

    def get(key):
        return cfg[key] if cfg.get(key) is not None else _DEFAULTS.get(key)

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported Granite activation {act!r}; supported: ['silu']")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"Granite checkpoints with {key}=true are not supported")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    num_layers, head_dim = cfg["num_hidden_layers"], cfg.get("head_dim") or hidden // heads
    moe = _hf_moe(cfg, arch, get)
    shared = 0
    if arch in _MOE_ARCHITECTURES:  # transformers' default: 1024 for the hybrid, else none
        shared = cfg.get("shared_intermediate_size", 1024 if arch == GRANITE_HYBRID else 0) or 0
    if arch == GRANITE_HYBRID and not shared:
        raise ValueError("a GraniteMoeHybrid config.json needs shared_intermediate_size > 0")
    width = moe.intermediate_size if moe else shared or cfg.get("intermediate_size")
    if not width:
        raise ValueError("Granite config.json lacks intermediate_size")
    mamba = _hf_mamba(cfg, get, num_layers) if arch == GRANITE_HYBRID else None
    rope = arch != GRANITE_HYBRID or cfg.get("position_embedding_type") == "rope"
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=width,
        rms_norm_eps=get("rms_norm_eps"),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        moe=moe,
        linear_attn=mamba,
        granite=GraniteParams(
            embedding_multiplier=_multiplier(cfg, "embedding_multiplier"),
            attention_multiplier=_multiplier(cfg, "attention_multiplier", head_dim),
            residual_multiplier=_multiplier(cfg, "residual_multiplier"),
            logits_scaling=_multiplier(cfg, "logits_scaling"),
            shared_intermediate_size=shared, rope=rope),
        **hf_rope_fields(cfg, arch),
    )


def _multiplier(cfg: dict, key: str, head_dim: int | None = None) -> float:
    """A multiplier of config.json: 1.0 where absent (transformers' default); a null one
    scales nothing (for the attention: transformers then passes no scale, 1 / sqrt(head_dim))."""
    if key not in cfg:
        return 1.0
    if cfg[key] is None:
        return head_dim ** -0.5 if head_dim else 1.0
    return float(cfg[key])


def _hf_moe(cfg: dict, arch: str, get) -> MoeConfig | None:
    """transformers' Granite MoE block: top-k of the router's logits, softmax over those k
    (the renormalized top-k of a softmax over all); no MoE where ``num_local_experts`` is 0
    (the dense Granite 4.0-H models)."""
    if arch not in _MOE_ARCHITECTURES or not get("num_local_experts"):
        return None
    if not cfg.get("intermediate_size"):
        raise ValueError("a Granite MoE config.json needs intermediate_size (the experts')")
    return MoeConfig(get("num_local_experts"), get("num_experts_per_tok"),
                     cfg["intermediate_size"], norm_topk_prob=True)


def _hf_mamba(cfg: dict, get, num_layers: int) -> Mamba2Params | None:
    """The Mamba2 layout of a GraniteMoeHybrid config.json; None where every layer attends."""
    named = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * num_layers
    unknown = sorted(set(named) - set(_LAYER_TYPES))
    if unknown or len(named) != num_layers:
        raise ValueError(f"unsupported Granite layer_types {unknown or named}; supported: "
                         f"{num_layers} of {sorted(_LAYER_TYPES)}")
    layer_types = tuple(_LAYER_TYPES[t] for t in named)
    if LINEAR not in layer_types:
        return None
    inner = get("mamba_expand") * cfg["hidden_size"]
    heads = get("mamba_n_heads")
    head_dim = inner // heads if get("mamba_d_head") == "auto" else get("mamba_d_head")
    if heads * head_dim != inner:
        raise ValueError(f"Mamba2 heads x head dim ({heads} x {head_dim}) must equal "
                         f"mamba_expand x hidden_size ({inner})")
    limit = cfg.get("time_step_limit") or (0.0, math.inf)
    return Mamba2Params(layer_types=layer_types, num_heads=heads, head_dim=head_dim,
                        state_size=get("mamba_d_state"), n_groups=get("mamba_n_groups"),
                        conv_kernel=get("mamba_d_conv"),
                        time_step_limit=tuple(_json_float(x) for x in limit),
                        conv_bias=bool(get("mamba_conv_bias")),
                        proj_bias=bool(get("mamba_proj_bias")))


def _json_float(value) -> float:
    """A float of config.json; transformers 5 writes infinity as {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) else value)


def granite_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``granite`` / ``granitemoe`` / ``granitehybrid`` GGUF file (the
    keys llama.cpp's converter writes); ``field(reader, key, default)`` reads one value. A
    hybrid's recurrent layers are those whose ``attention.head_count_kv`` entry is 0; its
    attention rotates q and k unless ``rope.scaling.finetuned`` is false (llama.cpp's switch)."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError("this Granite GGUF file has no token_embd.weight")
    hidden, heads, num_layers = (get("embedding_length"), get("attention.head_count"),
                                 get("block_count"))
    head_dim = get("attention.key_length", hidden // heads)
    kv = get("attention.head_count_kv", heads)
    kv_heads = [int(n) for n in kv] if isinstance(kv, list) else [int(kv)] * num_layers
    layer_types = tuple(LINEAR if n == 0 else FULL for n in kv_heads)
    moe = moe_from_gguf(lambda key, default=None: field(reader, key, default), gguf_arch,
                        set(tensors), num_layers)
    shared = 0  # a hybrid's MLP always has the shared part; granitemoe's where it is stored
    if gguf_arch == "granitehybrid" or any(n.endswith(".ffn_up_shexp.weight") for n in tensors):
        shared = get("expert_shared_feed_forward_length") or get("feed_forward_length")
    if moe is not None:  # the shared expert is Granite's ungated shared_mlp, not moe.py's
        moe = replace(moe, shared_expert_size=0)
    if moe is not None and shared and arch == GRANITE_MOE:
        arch = GRANITE_MOE_SHARED
    rope = bool(get("rope.scaling.finetuned", True))
    max_positions = get("context_length", 2048)
    return ModelConfig(
        architecture=arch,
        vocab_size=int(tensors["token_embd.weight"].shape[1]),  # the converter pads the list
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=max(kv_heads) or heads,
        head_dim=head_dim,
        intermediate_size=moe.intermediate_size if moe else shared or get("feed_forward_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=max_positions,
        tie_word_embeddings="output.weight" not in tensors,
        moe=moe,
        linear_attn=_gguf_mamba(get, layer_types, tensors) if LINEAR in layer_types else None,
        granite=GraniteParams(
            embedding_multiplier=float(get("embedding_scale", 1.0)),
            attention_multiplier=float(get("attention.scale", head_dim ** -0.5)),
            residual_multiplier=float(get("residual_scale", 1.0)),
            logits_scaling=float(get("logit_scale", 1.0)),
            shared_intermediate_size=shared, rope=rope),
        **gguf_rope_fields(lambda key, default=None: field(reader, key, default), tensors,
                           gguf_arch, head_dim, max_positions),
    )


def _gguf_mamba(get, layer_types: tuple[str, ...], tensors: dict) -> Mamba2Params:
    first = layer_types.index(LINEAR)
    heads, inner = get("ssm.time_step_rank"), get("ssm.inner_size")
    return Mamba2Params(layer_types=layer_types, num_heads=heads, head_dim=inner // heads,
                        state_size=get("ssm.state_size"), n_groups=get("ssm.group_count"),
                        conv_kernel=get("ssm.conv_kernel"),
                        conv_bias=f"blk.{first}.ssm_conv1d.bias" in tensors,
                        proj_bias=f"blk.{first}.ssm_in.bias" in tensors)


# a Granite folder's tensor names → the model's (models/granite.py): the MoE block is ``mlp``
# (layers/moe.py: router ``gate``, experts fused 3-D as moe.py's HF_FUSED_EXPERTS), the
# shared MLP ``shared_mlp`` with gate and up fused as its ``input_linear`` holds them
_HF_RENAMES = (
    (".block_sparse_moe.input_linear.weight", ".mlp.experts.gate_up_proj"),
    (".block_sparse_moe.output_linear.weight", ".mlp.experts.down_proj"),
    (".block_sparse_moe.router.layer.weight", ".mlp.gate.weight"),
    (".block_sparse_moe.router.weight", ".mlp.gate.weight"),  # transformers 5's own names
    (".block_sparse_moe.experts.", ".mlp.experts."),
    (".shared_mlp.input_linear.", ".shared_mlp.gate_up_proj."),
    (".shared_mlp.output_linear.", ".shared_mlp.down_proj."),
)


def granite_hf_name(name: str) -> str:
    """A Granite folder's tensor name → the model's, without ``model.``."""
    name = name.removeprefix("model.")
    for old, new in _HF_RENAMES:
        if old in name:
            return name.replace(old, new)
    return name
