"""Tiny random LFM2 models (hybrid: gated short-conv and GQA attention layers), as Hugging Face
folders and as GGUF files, for load and logit-parity tests.

* :func:`make_lfm2_hf_model` builds an ``Lfm2ForCausalLM`` with transformers' own class (5
  layers: conv, conv, attention, conv, attention; the head tied to the embedding, as the
  releases have it; an ``intermediate_size`` the config auto-adjusts: 2/3 of 200 rounded up to
  a multiple of 32, 160) and saves it with the tiny tokenizer of tiny_models.py.
* :func:`make_lfm2_moe_hf_model`: the same with ``Lfm2MoeForCausalLM`` (the first layer dense,
  the others sparse: 8 experts, top-2, width 32, sigmoid routing with a random expert bias),
  its experts one tensor each as ``save_pretrained`` and the releases store them.
* :func:`lfm2_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py`` does
  for the ``lfm2`` / ``lfm2moe`` architectures (conversion/lfm2.py: the conv kernel squeezed
  to [hidden, K], per-layer KV head counts with 0 for conv layers, the adjusted MLP width,
  experts stacked 3-D, the expert bias as ``exp_probs_b.bias``; names from gguf-py's own
  tensor map), checked against the real converter by
  benchmarks/check_tiny_lfm2_converter.py.
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
    save_tokenizer,
)

CONV, FULL = "conv", "full_attention"
LFM2_DEFAULTS = {
    "hidden_size": 64, "intermediate_size": 200, "block_multiple_of": 32,
    "num_hidden_layers": 5, "layer_types": [CONV, CONV, FULL, CONV, FULL],
    "num_attention_heads": 4, "num_key_value_heads": 2, "conv_L_cache": 3,
    "max_position_embeddings": 512, "norm_eps": 1e-5, "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
LFM2_MOE_DEFAULTS = {"intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
                     "num_experts_per_tok": 2, "num_dense_layers": 1}
_CONV_STD = 0.5  # a depthwise kernel of 3 taps: large enough that the conv mixes tokens
_EXPERT_BIAS_STD = 0.2  # against sigmoid scores spread ~0.2: the bias changes the picks


def make_lfm2_hf_model(out_dir: str | Path, seed: int = 0, *,
                       save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Build a tiny random LFM2 model and save it with the tiny tokenizer to ``out_dir``;
    ``overrides`` replace config fields (``tie_word_embeddings=False``, ``layer_types=...``).
    Returns ``out_dir``."""
    return _make(out_dir, seed, False, save_dtype, overrides)


def make_lfm2_moe_hf_model(out_dir: str | Path, seed: int = 0, *,
                           save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """:func:`make_lfm2_hf_model` for the MoE model (``LFM2_MOE_DEFAULTS``)."""
    return _make(out_dir, seed, True, save_dtype, overrides)


def _make(out_dir, seed: int, moe: bool, save_dtype, overrides: dict) -> Path:
    import transformers
    from transformers import GenerationConfig

    kind = "Lfm2Moe" if moe else "Lfm2"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(LFM2_DEFAULTS, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    if moe:
        fields.update(LFM2_MOE_DEFAULTS)
        del fields["block_multiple_of"]  # (Lfm2MoeConfig has none)
    fields.update(overrides)
    config = getattr(transformers, f"{kind}Config")(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{kind}ForCausalLM")(config).to(torch.float32)
    _randomize_lfm2_(model, seed)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.to(save_dtype).save_pretrained(str(out_dir))
    return out_dir


def _randomize_lfm2_(model: torch.nn.Module, seed: int) -> None:
    """``_randomize_`` (plain norms: mean 1), then a conv kernel that mixes tokens and a
    random expert bias (a buffer, which ``_randomize_`` does not see)."""
    _randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("conv.conv.weight"):
                param.copy_(_CONV_STD * torch.randn(param.shape, generator=gen))
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(_EXPERT_BIAS_STD * torch.randn(buffer.shape, generator=gen))


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------

def ffn_width(config: dict) -> int:
    """``LFM2Model._add_feed_forward_length``: the auto-adjusted dense MLP width."""
    width = config.get("block_ff_dim", config["intermediate_size"])
    if config["block_auto_adjust_ff_dim"]:
        width = int(2 * width / 3)
        if config["block_ffn_dim_multiplier"] is not None:
            width = int(config["block_ffn_dim_multiplier"] * width)
        multiple = config["block_multiple_of"]
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def _merge_experts(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``LFM2MoeModel.modify_tensors`` on the experts: each layer's per-expert ``w1`` / ``w2`` /
    ``w3`` stacked as ``layers.{bid}.feed_forward.experts.{w}.weight`` [E, rows, cols]."""
    out, per_expert = {}, {}
    for name, w in state.items():
        prefix, sep, rest = name.partition(".feed_forward.experts.")
        if not sep:
            out[name] = w
            continue
        expert, kind, _ = rest.split(".")
        per_expert.setdefault((prefix.removeprefix("model."), kind), {})[int(expert)] = w
    for (prefix, kind), by_expert in per_expert.items():
        out[f"{prefix}.feed_forward.experts.{kind}.weight"] = np.stack(
            [by_expert[e] for e in range(len(by_expert))])
    return out


def _gguf_tensors(state: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """GGUF name → float32 array of each tensor of the folder's ``state``."""
    import gguf

    arch = gguf.MODEL_ARCH.LFM2MOE if _is_moe(config) else gguf.MODEL_ARCH.LFM2
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    tensors = {}
    for name, w in _merge_experts(state).items():
        if name.endswith(".expert_bias"):  # filter_tensors: a suffix the map knows
            name += ".bias"
        if "conv.conv" in name:
            w = w.squeeze(1)  # [hidden, 1, K] → [hidden, K]
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {name!r}")
        tensors[gguf_name] = w
    return tensors


def _qtype(name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's choice: 1-D tensors, norms, the conv kernel (``shortconv.conv``) and the
    router (``ffn_gate_inp``) stay F32; the other matrices take ``ftype``."""
    if (w.ndim <= 1 or name.endswith("_norm.weight") or ".shortconv.conv." in name
            or ".ffn_gate_inp." in name or not name.endswith(".weight")):
        return "F32"
    return ftype


def _add_hparams(writer, config: dict, ftype: str) -> None:
    """The keys TextModel and LFM2Model / LFM2MoeModel write."""
    import gguf

    moe = _is_moe(config)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-lfm2")  # the converter's: from the folder name
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"] if moe else ffn_width(config))
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv([config["num_key_value_heads"] if t == FULL else 0
                              for t in config["layer_types"]])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    if moe:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_leading_dense_block_count(config["num_dense_layers"])
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_shortconv_l_cache(config["conv_L_cache"])


def _is_moe(config: dict) -> bool:
    return config["model_type"] == "lfm2_moe"


def lfm2_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_lfm2_hf_model` into an ``lfm2`` GGUF file (one of
    :func:`make_lfm2_moe_hf_model` into an ``lfm2moe`` one): ``ftype`` F32, F16, BF16 or Q8_0
    for the matrices (``_qtype``). Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    tensors = _gguf_tensors(_load_state_dict(hf_dir), config)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "lfm2moe" if _is_moe(config) else "lfm2")
    _add_hparams(writer, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
