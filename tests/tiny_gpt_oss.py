"""Tiny random gpt-oss models (``GptOssForCausalLM``: attention sinks, alternating sliding /
full layers, yarn rope, MoE blocks with the clamped SwiGLU), as Hugging Face folders and as
GGUF files, for load and logit-parity tests.

* :func:`make_gpt_oss_hf_model` builds one with transformers' own class (float32 weights, fused
  experts as ``save_pretrained`` writes them) and saves it with the tiny tokenizer of
  tiny_models.py. The sinks are drawn N(0, 1) and the SwiGLU limit set low, so that the sinks
  and the clamps move the logits.
* :func:`gpt_oss_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py``
  does (``GptOssModel``: the fused experts cut per kind and transposed, gate and up from the
  even and odd columns; names from gguf-py's own tensor map), checked against the real
  converter by benchmarks/check_tiny_gpt_oss_converter.py. ``experts="MXFP4"`` stores the
  expert matrices as MXFP4 (gguf-py's quantizer), as the released GGUF files hold them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_hybrid import _qtype
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

GPT_OSS_DEFAULTS = {
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "swiglu_limit": 0.25,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 128, "rope_theta": 150000.0},
}


def make_gpt_oss_hf_model(out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """Build a tiny random gpt-oss and save it (float32) with the tiny tokenizer to
    ``out_dir``; ``overrides`` replace config fields. Returns ``out_dir``."""
    from transformers import GenerationConfig, GptOssConfig, GptOssForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(GPT_OSS_DEFAULTS, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id, tie_word_embeddings=False)
    fields.update(overrides)
    config = GptOssConfig(**fields)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config).to(torch.float32)
    _randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.copy_(torch.randn(param.shape, generator=gen))
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.save_pretrained(str(out_dir))
    return out_dir


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------


def _convert(name: str, w: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``GptOssModel.filter_tensors`` / ``modify_tensors`` on one tensor (a float folder's):
    HF-style names, not yet GGUF's."""
    if name.endswith("sinks"):
        return [(name + ".weight", w)]
    if name.endswith("down_proj_bias"):
        return [(name.replace("down_proj_bias", "down_proj.bias"), w)]
    if name.endswith("down_proj"):
        return [(name + ".weight", np.swapaxes(w, -1, -2))]
    if name.endswith("gate_up_proj_bias"):
        return [(name.replace("gate_up_proj_bias", "gate_proj.bias"), w[..., ::2]),
                (name.replace("gate_up_proj_bias", "up_proj.bias"), w[..., 1::2])]
    if name.endswith("gate_up_proj"):
        w = np.swapaxes(w, -1, -2)
        return [(name.replace("gate_up_proj", "gate_proj.weight"), w[:, ::2, :]),
                (name.replace("gate_up_proj", "up_proj.weight"), w[:, 1::2, :])]
    return [(name, w)]


def _gguf_tensors(state: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """GGUF name → float32 array of each tensor of the folder's ``state``."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, config["num_hidden_layers"])
    tensors = {}
    for hf_name, w in state.items():
        for name, part in _convert(hf_name, w):
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise KeyError(f"no GGUF name for tensor {hf_name!r}")
            tensors[gguf_name] = np.ascontiguousarray(part)
    return tensors


def _add_hparams(writer, config: dict, ftype: str) -> None:
    """The keys TextModel and GptOssModel write, in their order."""
    import gguf

    rope = config["rope_parameters"]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-gpt-oss")  # the converter's: from the folder name
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def gpt_oss_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32",
                       experts: str | None = None) -> Path:
    """Convert a folder written by :func:`make_gpt_oss_hf_model` into a ``gpt-oss`` GGUF file:
    ``ftype`` F32, F16 or Q8_0 for the matrices (norms, biases, sinks and the router stay
    F32); ``experts`` "MXFP4": the expert matrices in MXFP4 whatever ``ftype``. Returns
    ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    tensors = _gguf_tensors(_load_state_dict(hf_dir), config)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT_OSS])
    _add_hparams(writer, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        if experts == "MXFP4" and name.endswith("_exps.weight"):
            qtype = gguf.GGMLQuantizationType.MXFP4
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
