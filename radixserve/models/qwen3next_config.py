"""Qwen3-Next shapes (``Qwen3NextForCausalLM``, model_type ``qwen3_next``, llama.cpp's
``qwen3next``) from a Hugging Face config.json or GGUF metadata, and the checkpoint names of a
folder's weights (a GGUF file's are in qwen3next_gguf.py).

The decoder is Qwen3.5's (qwen35_config.py): ``linear_attention`` (Gated DeltaNet) and
``full_attention`` layers, by ``layer_types`` or else ``full_attention_interval`` (default 4),
head-gated attention with q/k norms and rope on the first ``partial_rotary_factor`` (0.25) of
each head (plain RoPE: Qwen3-Next has no mRoPE). The MLPs follow Qwen2-MoE's config: a layer is
a sparse MoE block (softmax router, top-k renormalized where ``norm_topk_prob``, a shared
expert scaled by a sigmoid gate) unless it is in ``mlp_only_layers`` or ``(i + 1)`` is not a
multiple of ``decoder_sparse_step``, or there are no experts; then it is a dense SwiGLU MLP of
``intermediate_size``. There is no ConditionalGeneration wrapper; the checkpoints' MTP block
(``mtp.*``) runs only as the drafter of ``--speculative mtp``.

A ``qwen3next`` GGUF file holds the keys a ``qwen35`` one does (llama.cpp's converter writes
both through its ``Qwen3NextModel``), so qwen35_config.py's ``qwen35_gguf_config`` reads it: a
layer is sparse where it has a router, the top-k weights renormalized as llama.cpp's qwen3next
graph does.
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig, MoeConfig
from radixserve.models.qwen35_config import default_layer_types
from radixserve.recurrent_params import LinearAttnParams

QWEN3NEXT_ARCHITECTURE = "Qwen3NextForCausalLM"
QWEN3NEXT_ARCHITECTURES = (QWEN3NEXT_ARCHITECTURE,)
_DEFAULTS = {  # transformers' Qwen3NextConfig defaults, for fields a file omits
    "intermediate_size": 5632, "head_dim": 256, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
    "partial_rotary_factor": 0.25, "full_attention_interval": 4, "rope_theta": 10000.0,
    "decoder_sparse_step": 1, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512,
    "norm_topk_prob": True}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")


def qwen3next_hf_config(cfg: dict, arch: str = QWEN3NEXT_ARCHITECTURE) -> ModelConfig:
    """The ModelConfig of a ``Qwen3NextForCausalLM`` config.json. ValueError for what
    radixserve does not run: an activation other than silu, rope scaling, layer types that do
    not match the layer count."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"Qwen3-Next config.json lacks {missing}")

    def get(key):
        found = cfg.get(key)
        return _DEFAULTS.get(key) if found is None else found

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported Qwen3-Next activation {act!r}; supported: ['silu']")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"unsupported Qwen3-Next rope type {rope_type!r}; "
                         "supported: ['default']")
    num_layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types") or default_layer_types(
        num_layers, get("full_attention_interval"))
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    head_dim = get("head_dim")
    partial = rope.get("partial_rotary_factor", get("partial_rotary_factor"))
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg["num_key_value_heads"] or heads,
        head_dim=head_dim,
        intermediate_size=get("intermediate_size"),
        rms_norm_eps=get("rms_norm_eps"),
        rope_theta=float(rope.get("rope_theta") or get("rope_theta")),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=True,
        rotary_dim=None if partial == 1.0 else int(head_dim * partial),
        linear_attn=LinearAttnParams(
            layer_types=tuple(layer_types),
            num_key_heads=get("linear_num_key_heads"),
            num_value_heads=get("linear_num_value_heads"),
            key_head_dim=get("linear_key_head_dim"),
            value_head_dim=get("linear_value_head_dim"),
            conv_kernel=get("linear_conv_kernel_dim"),
        ),
        attn_output_gate=True,
        moe=_hf_moe(get, cfg.get("mlp_only_layers") or (), num_layers),
    )


def _hf_moe(get, mlp_only_layers, num_layers: int) -> MoeConfig | None:
    """transformers' rule (``Qwen3NextDecoderLayer``): layer i is sparse unless it is in
    ``mlp_only_layers``, (i + 1) is not a multiple of ``decoder_sparse_step``, or there are
    no experts (then no layer is: None)."""
    num_experts, step = get("num_experts"), get("decoder_sparse_step") or 1
    if not num_experts:
        return None
    only = set(mlp_only_layers)
    dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
    return MoeConfig(num_experts, get("num_experts_per_tok"), get("moe_intermediate_size"),
                     norm_topk_prob=bool(get("norm_topk_prob")), dense_layers=dense,
                     shared_expert_size=get("shared_expert_intermediate_size"))


def qwen3next_hf_name(name: str) -> str | None:
    """A Qwen3-Next folder's tensor name → the model's, without ``model.`` (the MTP block's
    ``mtp.*``: the model drops them unless the block runs)."""
    return name.removeprefix("model.")
