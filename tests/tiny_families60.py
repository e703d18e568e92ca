"""Tiny random SmolLM3, OLMo 2, OLMo 3 and Ministral 3 models (issue 60), as Hugging Face
folders made with transformers' own classes and as the GGUF files llama.cpp's converter writes
for them.

* :func:`make_family_hf_model` builds one (``KINDS``) with random fp32 weights and saves it with
  the tiny tokenizer of tiny_models.py: SmolLM3 with 4 layers (layer 3 NoPE), OLMo 2 with 2,
  OLMo 3 with 4 (three sliding layers of window 8, then a full one; yarn on the full layers,
  a plain rope of another base on the sliding ones, so the split shows), Ministral 3 as a
  ``Mistral3ForConditionalGeneration`` folder (2 text layers with yarn and Llama 4's attention
  temperature from position 16 on, a tiny random Pixtral tower and projector).
* :func:`family_hf_to_gguf` writes such a folder as ``convert_hf_to_gguf.py`` does
  (``SmolLM3Model``: LlamaModel's keys and Q/K row permutation, arch ``smollm3``;
  ``Olmo2Model`` for both OLMo's, arch ``olmo2``, with the window and its pattern for OLMo 3;
  ``Mistral3Model``: LlamaModel's plus the yarn log multiplier and the temperature, arch
  ``mistral3``, the vision tensors left out; names from gguf-py's tensor map), checked against
  the real converter by benchmarks/check_tiny_families60_converter.py.
"""

from __future__ import annotations

import json
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
    permute_qk,
    save_tokenizer,
)

KINDS = ("smollm3", "olmo2", "olmo3", "mistral3")
_COMMON = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-6}
DEFAULTS = {
    "smollm3": {"num_hidden_layers": 4, "rope_theta": 10000.0, "tie_word_embeddings": True},
    "olmo2": {"num_hidden_layers": 2, "rope_theta": 10000.0, "tie_word_embeddings": False},
    "olmo3": {"num_hidden_layers": 4, "sliding_window": 8, "tie_word_embeddings": False,
              "rope_parameters": {
                  "full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                     "original_max_position_embeddings": 256},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}},
    # the text config; the releases' yarn shape (mscale 1 = mscale_all_dim), original length
    # 16 so the temperature scales the queries from position 16 on
    "mistral3": {"num_hidden_layers": 2, "head_dim": 16, "max_position_embeddings": 128,
                 "tie_word_embeddings": False,
                 "rope_parameters": {"type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                     "original_max_position_embeddings": 16,
                                     "max_position_embeddings": 128, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                     "llama_4_scaling_beta": 0.1}},
}
_CLASSES = {"smollm3": "SmolLM3", "olmo2": "Olmo2", "olmo3": "Olmo3", "mistral3": "Ministral3"}
GGUF_ARCH = {"smollm3": "smollm3", "olmo2": "olmo2", "olmo3": "olmo2", "mistral3": "mistral3"}
_PIXTRAL = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16, "patch_size": 4,
            "image_size": 16}


def make_family_hf_model(kind: str, out_dir: str | Path, seed: int = 0,
                         save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
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
    if kind == "mistral3":  # the text model inside a vision + text folder
        config = transformers.Mistral3Config(text_config=config.to_dict(), vision_config=_PIXTRAL,
                                             tie_word_embeddings=False)
        model = transformers.Mistral3ForConditionalGeneration(config).to(torch.float32)
    else:
        model = getattr(transformers, f"{_CLASSES[kind]}ForCausalLM")(config).to(torch.float32)
    _randomize_(model, seed)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.to(save_dtype).save_pretrained(str(out_dir))
    return out_dir


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------


def _gguf_tensors(arch: str, config: dict, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name → float32 array: the vision tensors dropped and ``language_model.`` removed
    (TextModel.filter_tensors), the tied head dropped, Llama's Q/K rows permuted
    (LlamaModel.modify_tensors), names from gguf-py's map of the architecture."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = arch in ("smollm3", "mistral3")
    tensors = {}
    for hf_name, w in state.items():
        if "vision_tower." in hf_name or "multi_modal_projector." in hf_name:
            continue
        hf_name = hf_name.replace("language_model.", "")
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        if permuted and hf_name.endswith("q_proj.weight"):
            w = permute_qk(w, n_head)
        elif permuted and hf_name.endswith("k_proj.weight"):
            w = permute_qk(w, n_kv)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {hf_name!r}")
        tensors[gguf_name] = w
    return tensors


def _rope_keys(writer, config: dict) -> None:
    """TextModel.set_gguf_parameters' rope keys: the full layers' type and theta (transformers
    5 configs: ``rope_parameters`` per layer type), the sliding layers' theta."""
    import gguf

    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    full = params.get("full_attention", params)
    if full.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(full["factor"])
        writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        for key, add in (("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if full.get(key) is not None:
                add(full[key])
    elif full.get("rope_type", "default") != "default":
        raise NotImplementedError(f"rope type {full['rope_type']!r}")
    theta = full.get("rope_theta", config.get("rope_theta"))
    if theta is not None:
        writer.add_rope_freq_base(theta)
    if (swa := params.get("sliding_attention", {}).get("rope_theta")) is not None:
        writer.add_rope_freq_base_swa(swa)


def _add_hparams(writer, arch: str, config: dict, ftype: str) -> None:
    """The keys TextModel, LlamaModel (smollm3, mistral3), Ministral3Model and Olmo2Model write."""
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(f"tiny-{arch}")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    _rope_keys(writer, config)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    if arch in ("smollm3", "mistral3"):  # LlamaModel
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(
            config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    if arch == "mistral3" and config.get("model_type") == "ministral3":  # Ministral3Model
        rope = config["rope_parameters"]
        writer.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        writer.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    if arch == "olmo2" and "sliding_window" in config:  # Olmo2Model (OLMo 3)
        writer.add_sliding_window(config["sliding_window"])
        types = config.get("layer_types") or [
            "sliding_attention" if (i + 1) % 4 else "full_attention"
            for i in range(config["num_hidden_layers"])]
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])


def _qtype(w: np.ndarray, ftype: str) -> str:
    return "F32" if w.ndim <= 1 else ftype


def family_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_family_hf_model` into the GGUF file the converter
    writes (``smollm3``, ``olmo2`` or ``mistral3``); ``ftype`` F32, F16, BF16 or Q8_0 for the
    matrices. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    arch = GGUF_ARCH[config["model_type"]]
    config = {**config, **config.get("text_config", {})}  # the converter's hparams
    tensors = _gguf_tensors(arch, config, _load_state_dict(hf_dir))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), arch)
    _add_hparams(writer, arch, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
