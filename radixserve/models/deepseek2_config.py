"""Shapes of the multi-head latent attention decoders: GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``,
model_type ``glm4_moe_lite``), DeepSeek-V3 (``DeepseekV3ForCausalLM``) and DeepSeek-V2
(``DeepseekV2ForCausalLM``: V2-Lite's greedy softmax routing) from a Hugging Face config.json,
and a folder's tensor names as models/deepseek2.py names them.

Both are DeepSeek-V3's decoder: MLA attention (models/mla.py: ``ModelConfig.mla``; the KV pool
sees ONE head of ``kv_lora_rank + qk_rope_head_dim`` per layer), the first layers with a dense
SwiGLU MLP (GLM's ``mlp_layer_types``, DeepSeek's ``first_k_dense_replace``), the others a MoE
block routed as DeepSeek-V3 routes (sigmoid scores, ``e_score_correction_bias`` for the choice
only, ``n_group`` / ``topk_group``, ``routed_scaling_factor``) with ungated shared experts;
DeepSeek-V2's router is a softmax over all experts, its top-k weights not renormalized
(transformers ignores ``norm_topk_prob`` there), times ``routed_scaling_factor``; its
``group_limited_greedy`` (V2, V2.5) is refused. V2's rope rotates adjacent pairs as V3's does.
YaRN rope (DeepSeek-V3) also scales the softmax by ``mscale(factor, mscale_all_dim) ** 2``, as
transformers' ``yarn_apply_mscale``.
"""

from __future__ import annotations

import math

from radixserve.layers.rope_scaling import normalize_rope_scaling, rope_type
from radixserve.model_config import MlaParams, ModelConfig, MoeConfig

GLM4_MOE_LITE = "Glm4MoeLiteForCausalLM"
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"
DEEPSEEK_V2 = "DeepseekV2ForCausalLM"
DEEPSEEK2_ARCHITECTURES = (GLM4_MOE_LITE, DEEPSEEK_V3, DEEPSEEK_V2)
# transformers' defaults for the fields a config.json may omit (Glm4MoeLiteConfig /
# DeepseekV3Config), then the ones both share
_DEFAULTS = {
    GLM4_MOE_LITE: {"rms_norm_eps": 1e-5, "routed_scaling_factor": 1.8, "n_routed_experts": 64,
                    "num_experts_per_tok": 4, "q_lora_rank": 768, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 192, "v_head_dim": 256, "first_k_dense_replace": 1},
    DEEPSEEK_V3: {"rms_norm_eps": 1e-6, "routed_scaling_factor": 2.5, "n_routed_experts": 256,
                  "num_experts_per_tok": 8, "q_lora_rank": 1536, "kv_lora_rank": 512,
                  "qk_nope_head_dim": 128, "v_head_dim": 128, "first_k_dense_replace": 3,
                  "n_group": 8, "topk_group": 4},
    DEEPSEEK_V2: {"rms_norm_eps": 1e-6, "routed_scaling_factor": 1.0, "n_routed_experts": 64,
                  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                  "v_head_dim": 128, "first_k_dense_replace": 0, "n_shared_experts": 2},
}
_SHARED_DEFAULTS = {"qk_rope_head_dim": 64, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                    "norm_topk_prob": True, "rope_interleave": True, "hidden_act": "silu",
                    "max_position_embeddings": 4096, "rope_theta": 10000.0}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "moe_intermediate_size")
# transformers' router adds this to the sum of the chosen scores before dividing
_ROUTER_NORM_EPS = 1e-20


def deepseek2_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a GLM-4.7-Flash or DeepSeek-V3 config.json. ValueError for what does
    not run: a missing field, an activation other than SiLU."""
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"{arch} config.json lacks {missing}")

    def get(key):
        value = cfg.get(key, _DEFAULTS[arch].get(key, _SHARED_DEFAULTS.get(key)))
        if value is None and key != "q_lora_rank":  # None there: one q_proj
            return _DEFAULTS[arch].get(key, _SHARED_DEFAULTS.get(key))
        return value

    if get("hidden_act") != "silu":
        raise ValueError(f"{arch}: unsupported hidden_act {get('hidden_act')!r}; "
                         "supported: ['silu']")
    num_layers = cfg["num_hidden_layers"]
    params = cfg.get("rope_parameters") or {}
    scaling = normalize_rope_scaling(cfg.get("rope_scaling") or params,
                                     get("max_position_embeddings"))
    nope, rope = get("qk_nope_head_dim"), get("qk_rope_head_dim")
    mla = MlaParams(q_lora_rank=get("q_lora_rank"), kv_lora_rank=get("kv_lora_rank"),
                    qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=get("v_head_dim"),
                    rope_interleave=bool(get("rope_interleave")),
                    softmax_scale=softmax_scale(nope + rope, scaling))
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=cfg["num_attention_heads"],
        num_kv_heads=1,  # the latent row, shared by every head
        head_dim=mla.kv_lora_rank + rope,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=get("rms_norm_eps"),
        rope_theta=cfg.get("rope_theta") or params.get("rope_theta") or get("rope_theta"),
        rope_scaling=scaling,
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        moe=_moe(get, cfg, num_layers, arch),
        mla=mla,
    )


def softmax_scale(qk_head_dim: int, scaling: dict | None) -> float:
    """``qk_head_dim ** -0.5``, times YaRN's mscale squared where ``mscale_all_dim`` is set."""
    scale = qk_head_dim ** -0.5
    if rope_type(scaling) != "default" and (all_dim := (scaling or {}).get("mscale_all_dim")):
        factor = scaling["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def _moe(get, cfg: dict, num_layers: int, arch: str) -> MoeConfig:
    if "num_experts_per_tok" not in cfg and arch == DEEPSEEK_V2:
        raise ValueError(f"{arch} config.json lacks ['num_experts_per_tok']")
    types = cfg.get("mlp_layer_types")
    if types is not None:
        dense = tuple(i for i, kind in enumerate(types) if kind == "dense")
    else:
        first, freq = get("first_k_dense_replace"), cfg.get("moe_layer_freq") or 1
        dense = tuple(i for i in range(num_layers) if i < first or i % freq)
    width = cfg["moe_intermediate_size"]
    if arch == DEEPSEEK_V2:
        if (method := cfg.get("topk_method") or "greedy") != "greedy":
            raise ValueError(f"{arch}: unsupported topk_method {method!r} (DeepSeek-V2 / "
                             "V2.5's group-limited routing); supported: ['greedy']")
        return MoeConfig(get("n_routed_experts"), cfg["num_experts_per_tok"], width,
                         norm_topk_prob=False, dense_layers=dense,
                         shared_expert_size=get("n_shared_experts") * width,
                         routed_scaling=float(get("routed_scaling_factor")),
                         shared_expert_gate=False)
    return MoeConfig(get("n_routed_experts"), get("num_experts_per_tok"), width,
                     norm_topk_prob=bool(get("norm_topk_prob")), dense_layers=dense,
                     shared_expert_size=get("n_shared_experts") * width, scoring="sigmoid",
                     expert_bias=True, num_groups=get("n_group"), topk_groups=get("topk_group"),
                     routed_scaling=float(get("routed_scaling_factor")),
                     norm_eps=_ROUTER_NORM_EPS, shared_expert_gate=False)


def deepseek2_hf_name(name: str) -> str | None:
    """A folder's tensor name → the model's: the router's ``e_score_correction_bias`` as the
    MoE block's ``expert_bias``, ``shared_experts`` as ``shared_expert``."""
    return (name.replace(".mlp.gate.e_score_correction_bias", ".mlp.expert_bias")
            .replace(".mlp.shared_experts.", ".mlp.shared_expert."))

