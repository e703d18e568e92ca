"""llama.cpp's ``deepseek2`` GGUF files (GLM-4.7-Flash, DeepSeek-V3 and the like): their
metadata as a ModelConfig and their tensor names as models/deepseek2.py names them.

What the converter (``DeepseekV2Model``, ``Glm4MoeLiteModel``) writes:

- ``kv_b_proj`` split per head into ``attn_k_b`` [H, kv_lora_rank, nope] (transposed) and
  ``attn_v_b`` [H, v, kv_lora_rank]: the model's ``load_weights`` joins them back;
- ``head_count_kv`` 1, ``key_length`` kv_lora_rank + rope, ``key_length_mla`` nope + rope,
  ``value_length_mla`` v: the latent shapes; the dense layers are those without a router
  (``leading_dense_block_count`` is 0 in files made from transformers-5-saved GLM folders);
- ``expert_gating_func`` 2 for sigmoid scores (absent: as llama.cpp's deepseek2.cpp reads
  it, sigmoid for GLM-4.7-Flash's shape, 47 or 48 blocks of a 154,880-token vocabulary, else
  softmax, for older DeepSeek-V2 files), ``exp_probs_b`` the correction bias,
  ``expert_weights_scale`` / ``_norm``, ``expert_group_count`` / ``_used_count``;
- YaRN's ``mscale_all_dim`` as ``rope.scaling.yarn_log_multiplier`` = 0.1 * it; ``mscale`` is
  not written and is taken equal to it (DeepSeek-V3's config has both 1), so the rope's own
  attention factor is 1, as transformers computes it there;
- the rope dims stay in DeepSeek's interleaved order (llama.cpp's NORM rope), and the MTP
  block(s) (``nextn_predict_layers``) come after the decoder's.
"""

from __future__ import annotations

from radixserve.layers.rope_scaling import normalize_rope_scaling
from radixserve.model_config import MlaParams, ModelConfig, MoeConfig
from radixserve.models.deepseek2_config import softmax_scale
from radixserve.models.moe import GGUF_EXPERT_NAMES

_SOFTMAX, _SIGMOID = 1, 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*
_ROUTER_NORM_EPS = 1e-20
_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_k_b": "self_attn.k_b_proj", "attn_v_b": "self_attn.v_b_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", **GGUF_EXPERT_NAMES,
}
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def deepseek2_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``deepseek2`` file (``field(reader, key, default)`` reads one
    key). ValueError for what does not run here: softmax scores in expert groups (DeepSeek-V2's
    group-limited routing)."""
    a = gguf_arch

    def get(key, default=None):
        return field(reader, f"{a}.{key}", default)

    names = {t.name for t in reader.tensors}
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    num_layers = get("block_count") - get("nextn_predict_layers", 0)
    gating = get("expert_gating_func") or (
        _SIGMOID if get("block_count") in (47, 48) and vocab == 154880 else _SOFTMAX)
    rope = get("rope.dimension_count")
    kv_lora_rank = get("attention.kv_lora_rank")
    max_positions = get("context_length", 2048)
    scaling = None
    if get("rope.scaling.type", "none") == "yarn":
        all_dim = get("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        scaling = {"rope_type": "yarn", "factor": get("rope.scaling.factor"),
                   "beta_fast": get("rope.scaling.yarn_beta_fast", 32.0),
                   "beta_slow": get("rope.scaling.yarn_beta_slow", 1.0),
                   "mscale": all_dim, "mscale_all_dim": all_dim}
    elif get("rope.scaling.type", "none") != "none":
        raise ValueError(f"unsupported deepseek2 rope scaling {get('rope.scaling.type')!r}; "
                         "supported: none, yarn")
    scaling = normalize_rope_scaling(scaling, max_positions,
                                     get("rope.scaling.original_context_length"))
    nope = get("attention.key_length_mla") - rope
    mla = MlaParams(q_lora_rank=get("attention.q_lora_rank"), kv_lora_rank=kv_lora_rank,
                    qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                    v_head_dim=get("attention.value_length_mla"), rope_interleave=True,
                    softmax_scale=softmax_scale(nope + rope, scaling))
    return ModelConfig(
        architecture=arch, vocab_size=vocab,
        hidden_size=get("embedding_length"), num_layers=num_layers,
        num_heads=get("attention.head_count"), num_kv_heads=1, head_dim=kv_lora_rank + rope,
        intermediate_size=get("feed_forward_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=get("rope.freq_base", 10000.0), rope_scaling=scaling,
        max_position_embeddings=max_positions,
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_kv_a_mqa.bias" in names,
        moe=_moe(get, names, num_layers, gating == _SIGMOID), mla=mla)


def _moe(get, names: set[str], num_layers: int, sigmoid: bool) -> MoeConfig:
    width = get("expert_feed_forward_length")
    groups, kept = get("expert_group_count", 1) or 1, get("expert_group_used_count", 1) or 1
    if not sigmoid and kept < groups:
        raise ValueError("deepseek2 files with softmax expert scores in groups (DeepSeek-V2's "
                         "group-limited routing) are not supported; supported: sigmoid scores "
                         "(expert_gating_func 2), or softmax without groups")
    return MoeConfig(
        get("expert_count"), get("expert_used_count"), width,
        norm_topk_prob=bool(get("expert_weights_norm", False)),
        # a dense layer has no router (the key is 0 in files from folders that keep the
        # dense layers as transformers' mlp_layer_types only)
        dense_layers=tuple(i for i in range(num_layers)
                           if f"blk.{i}.ffn_gate_inp.weight" not in names),
        shared_expert_size=get("expert_shared_count", 0) * width,
        scoring="sigmoid" if sigmoid else "softmax",
        expert_bias=any(n.endswith(".exp_probs_b.bias") for n in names),
        num_groups=groups, topk_groups=kept,
        routed_scaling=float(get("expert_weights_scale", 1.0) or 1.0),
        norm_eps=_ROUTER_NORM_EPS if sigmoid else 0.0, shared_expert_gate=False)


def deepseek2_gguf_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name → the model's (MTP layers keep their block number: the model
    skips them; None for the MTP-only tensors). ValueError for an unknown tensor."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, base = parts[1], parts[2]
        if base == "nextn":
            return None
        if base == "exp_probs_b":
            return f"layers.{layer}.mlp.expert_bias"
        if base not in _NAMES or len(parts) != 4:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in a deepseek2 file")
        return f"layers.{layer}.{_NAMES[base]}.{parts[3]}"
    if parts[0] not in _TOP:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in a deepseek2 file")
    return f"{_TOP[parts[0]]}.{parts[1]}"
