"""Tiny random multi-head latent attention models as Hugging Face folders, made with
transformers' own classes: GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) and DeepSeek-V3
(``DeepseekV3ForCausalLM``).

:func:`make_mla_hf_model` builds one (``KINDS``) with random fp32 weights and saves it with the
tiny tokenizer of tiny_models.py: 3 layers (the first dense, then MoE blocks of 8 experts in
groups, top-2, a shared expert, a random correction bias), MLA with a q bottleneck (GLM) or
a plain ``q_proj`` (DeepSeek-V3 and -V2, as DeepSeek-V2-Lite has it), YaRN with
``mscale_all_dim`` (DeepSeek-V3), softmax routing without groups or bias (DeepSeek-V2-Lite's),
interleaved rope dims in all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
from tiny_models import (
    _FILE_TYPES,
    EOS_TOKEN,
    PAD_TOKEN,
    _add_tensor,
    _add_tokenizer,
    _load_state_dict,
    _randomize_,
    save_tokenizer,
)

KINDS = ("glm4_moe_lite", "deepseek_v3", "deepseek_v2")
# every matrix's row a whole number of Q8_0 blocks (32), as the converter needs to keep Q8_0
_COMMON = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
           "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 8, "v_head_dim": 24,
           "scoring_func": "sigmoid",
           "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
           "max_position_embeddings": 512, "tie_word_embeddings": False}
DEFAULTS = {
    "glm4_moe_lite": {"q_lora_rank": 32, "n_group": 2, "topk_group": 1,
                      "routed_scaling_factor": 1.8, "rms_norm_eps": 1e-5,
                      "mlp_layer_types": ["dense", "sparse", "sparse"],
                      "first_k_dense_replace": 1,  # as GLM-4.7-Flash's hub config has it
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "deepseek_v3": {"q_lora_rank": None, "n_group": 4, "topk_group": 2,
                    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
                    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0,
                                        "factor": 4.0, "original_max_position_embeddings": 128,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                        "mscale_all_dim": 1.0}},
    # DeepSeek-V2-Lite's routing: softmax over all experts, greedy top-k, no bias
    "deepseek_v2": {"q_lora_rank": None, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                    "routed_scaling_factor": 1.0, "first_k_dense_replace": 1,
                    "norm_topk_prob": False, "scoring_func": "softmax",
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
}
_CLASSES = {"glm4_moe_lite": "Glm4MoeLite", "deepseek_v3": "DeepseekV3",
            "deepseek_v2": "DeepseekV2"}


def make_mla_hf_model(kind: str, out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """Build a tiny random ``kind`` model (``KINDS``) and save it with the tiny tokenizer to
    ``out_dir``; ``overrides`` replace config fields. Returns ``out_dir``."""
    import transformers
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(_COMMON, **DEFAULTS[kind], vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    fields.update(overrides)
    config = getattr(transformers, f"{_CLASSES[kind]}Config")(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{_CLASSES[kind]}ForCausalLM")(config).to(torch.float32)
    _randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a buffer, not a parameter: the correction bias must matter
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.save_pretrained(str(out_dir))
    return out_dir


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------

_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(\w+)\.weight")
# the converter's ExpertGatingFuncType for config.json's ``scoring_func``
_GATING = {"sigmoid": 2, "softmax": 1}


def _gguf_tensors(config: dict, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name → float32 array as DeepseekV2Model.modify_tensors makes them: each layer's
    experts stacked [n_expert, rows, cols], ``kv_b_proj`` split per head into ``k_b``
    (transposed) and ``v_b``, the correction bias as ``e_score_correction.bias``, the tied head
    dropped; names from gguf-py's ``deepseek2`` map."""
    import gguf

    num_layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, num_layers)
    heads, nope, v = (config[k] for k in ("num_key_value_heads", "qk_nope_head_dim",
                                          "v_head_dim"))
    out: dict[str, np.ndarray] = {}

    def add(hf_name: str, w: np.ndarray) -> None:
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {hf_name!r}")
        out[gguf_name] = w

    experts: dict[str, list[tuple[int, np.ndarray]]] = {}
    for name, w in state.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        if ".mlp.experts." in name:
            prefix, index, proj = _EXPERT.match(name).groups()
            experts.setdefault(f"{prefix}.{proj}.weight", []).append((int(index), w))
        elif name.endswith("kv_b_proj.weight"):
            kv_b = w.reshape(heads, nope + v, w.shape[-1])
            add(name.replace("kv_b_proj", "k_b_proj"), kv_b[:, :nope].transpose(0, 2, 1))
            add(name.replace("kv_b_proj", "v_b_proj"), kv_b[:, nope:])
        else:
            add(name.replace("e_score_correction_bias", "e_score_correction.bias"), w)
    for name, parts in experts.items():
        add(name, np.stack([w for _, w in sorted(parts, key=lambda p: p[0])]))
    return out


def _add_hparams(writer, config: dict, ftype: str) -> None:
    """The keys TextModel and DeepseekV2Model write (``num_key_value_heads`` set to 1 first)."""
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-deepseek2")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(1)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta")))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])
    if config.get("scoring_func") is not None:
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType(_GATING[config["scoring_func"]]))
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    # DeepseekV2Model
    # transformers' Glm4MoeLiteConfig keeps the dense layers as mlp_layer_types only: without
    # the hub config's first_k_dense_replace the converter writes 0 (the tensors still say)
    writer.add_leading_dense_block_count(config.get("first_k_dense_replace") or 0)
    writer.add_vocab_size(config["vocab_size"])
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    kv_lora, rope_dims = config["kv_lora_rank"], config["qk_rope_head_dim"]
    writer.add_kv_lora_rank(kv_lora)
    writer.add_key_length(kv_lora + rope_dims)
    writer.add_value_length(kv_lora)
    writer.add_key_length_mla(config["qk_nope_head_dim"] + rope_dims)
    writer.add_value_length_mla(config["v_head_dim"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    writer.add_rope_dimension_count(rope_dims)
    if rope.get("mscale_all_dim") is not None:
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _qtype(name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type: 1-D tensors, norms, the router and biases in F32."""
    if w.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name:
        return "F32"
    return ftype


def mla_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_mla_hf_model` into the ``deepseek2`` GGUF file
    the converter writes; ``ftype`` F32, F16 or Q8_0 for the matrices. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    tensors = _gguf_tensors(config, _load_state_dict(hf_dir))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "deepseek2")
    _add_hparams(writer, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
