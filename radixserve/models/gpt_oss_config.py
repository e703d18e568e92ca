"""gpt-oss (``GptOssForCausalLM``, GGUF ``gpt-oss``) shapes from a config.json or a GGUF file,
and the GGUF tensor names.

What gpt-oss adds to the Llama shape (models/gpt_oss.py runs it):

- q / k / v / o biases and a learned attention sink per query head (``self_attn.sinks``;
  llama.cpp: ``attn_sinks.weight``);
- sliding-window layers (128 tokens in the releases) beside full ones: ``layer_types``, by
  default even layers sliding (transformers), llama.cpp's ``sliding_window_pattern`` 2;
- yarn rope with ``truncate: false`` (the releases' config.json); llama.cpp's converter drops
  ``truncate``, so a GGUF file's yarn gets it back here (the reference is transformers);
- every layer a MoE block: router with a bias, softmax over its top-k logits, experts with
  biases and the clamped SwiGLU (``MoeConfig`` "softmax_topk" / "swiglu_oai").
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig, MoeConfig
from radixserve.models.decoder_fields import gguf_decoder_fields, hf_decoder_fields
from radixserve.models.moe import EXPERT
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields

GPT_OSS_ARCHITECTURES = ("GptOssForCausalLM",)
_SLIDING, _FULL = "sliding_attention", "full_attention"
_DEFAULT_THETA = 150000.0  # transformers' GptOssConfig.default_theta
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}


def gpt_oss_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a gpt-oss config.json. ValueError for MXFP4 experts in the folder
    (the openai releases) or ``layer_types`` that are not one known type per layer."""
    if (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        raise ValueError("gpt-oss folders with MXFP4 experts (quantization_config mxfp4, the "
                         "openai releases) are not supported as folders; supported: a gpt-oss "
                         "GGUF file (llama.cpp keeps the MXFP4 experts, run as stored) or a "
                         "dequantized float / bf16 folder")
    num_layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or _default_types(num_layers)
    if len(types) != num_layers or set(types) - {_SLIDING, _FULL}:
        raise ValueError(f"unsupported layer_types {types}; supported: {num_layers} of "
                         f"{[_SLIDING, _FULL]}")
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    if not {"rope_type", "type"} & set(scaling):  # transformers' default: yarn
        scaling = {**_DEFAULT_ROPE, **scaling}
    rope_cfg = {**cfg, "rope_scaling": scaling, "rope_parameters": None,
                "rope_theta": cfg.get("rope_theta") or params.get("rope_theta") or _DEFAULT_THETA}
    moe = MoeConfig(cfg["num_local_experts"],
                    cfg.get("num_experts_per_tok") or cfg["experts_per_token"],
                    cfg["intermediate_size"], **_moe_fields(cfg.get("swiglu_limit", 7.0),
                                                            cfg.get("swiglu_alpha", 1.702)))
    window = cfg.get("sliding_window") or None
    return ModelConfig(architecture=arch, **hf_decoder_fields({**cfg, "rms_norm_eps":
                                                               cfg.get("rms_norm_eps", 1e-5)}),
                       **hf_rope_fields(rope_cfg, arch),
                       attention_bias=cfg.get("attention_bias", True), moe=moe,
                       sliding_window=window,
                       sliding_layers=tuple(t == _SLIDING for t in types) if window else None)


def _default_types(num_layers: int) -> list[str]:
    return [_SLIDING if (i + 1) % 2 else _FULL for i in range(num_layers)]


def _moe_fields(limit: float, alpha: float) -> dict:
    return {"norm_topk_prob": False, "scoring": "softmax_topk",
            "expert_activation": "swiglu_oai", "linear_bias": True,
            "swiglu_limit": float(limit), "swiglu_alpha": float(alpha)}


def gpt_oss_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``gpt-oss`` GGUF file (``field(reader, key, default)`` reads one
    metadata value). llama.cpp's graph fixes the SwiGLU's limit 7 and alpha 1.702."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    fields = gguf_decoder_fields(reader, get)
    num_layers = fields["num_layers"]
    rope = gguf_rope_fields(lambda key, default=None: field(reader, key, default),
                            {t.name: t for t in reader.tensors}, gguf_arch, fields["head_dim"],
                            fields["max_position_embeddings"])
    if rope["rope_scaling"] is not None and rope["rope_scaling"]["rope_type"] == "yarn":
        rope["rope_scaling"] = {**rope["rope_scaling"], "truncate": False}
    window = get("attention.sliding_window") or None
    pattern = get("attention.sliding_window_pattern", 2)
    if isinstance(pattern, list):
        sliding = tuple(bool(p) for p in pattern)
    else:  # llama.cpp's set_swa_pattern: the last layer of each period is full
        sliding = tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(num_layers))
    moe = MoeConfig(get("expert_count"), get("expert_used_count"),
                    get("expert_feed_forward_length") or fields["intermediate_size"],
                    **_moe_fields(7.0, 1.702))
    fields["intermediate_size"] = fields["intermediate_size"] or moe.intermediate_size
    return ModelConfig(architecture=arch, **fields, **rope, attention_bias=True, moe=moe,
                       sliding_window=window, sliding_layers=sliding if window else None)


_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": f"mlp.experts.{EXPERT}.gate_proj",
    "ffn_up_exps": f"mlp.experts.{EXPERT}.up_proj",
    "ffn_down_exps": f"mlp.experts.{EXPERT}.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def gpt_oss_hf_name(name: str) -> str:
    """A folder's tensor name → the model's: the router ``mlp.router`` is ``mlp.gate``."""
    return name.replace(".mlp.router.", ".mlp.gate.")


def gpt_oss_gguf_name(gguf_name: str) -> str:
    """llama.cpp tensor name of a gpt-oss file → the model's (no ``model.`` prefix). ValueError
    for a tensor gpt-oss does not have."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4:
        if parts[2] == "attn_sinks":
            return f"layers.{parts[1]}.self_attn.sinks"
        if parts[2] in _GGUF_LAYER_NAMES:
            return f"layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GGUF_TOP_NAMES:
        return f"{_GGUF_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a gpt-oss model")
