"""Tiny random IBM Granite models, as Hugging Face folders and as GGUF files, for load and
logit-parity tests.

* :func:`make_granite_hf_model` builds one with transformers' own class, by ``kind``:
  "granite" (``GraniteForCausalLM``: Llama with the four multipliers), "granitemoe" /
  "granitemoeshared" (4 experts, top-2, width 32; the latter a shared MLP of width 96) and
  "hybrid" / "hybrid-moe" (``GraniteMoeHybridForCausalLM``: layers Mamba2, Mamba2, attention,
  Mamba2 with 8 Mamba heads of 16 in 2 groups, state 16, no RoPE; a shared MLP of width 128,
  or of 96 beside 4 experts of width 32). Every multiplier differs from 1 (and the attention
  scale from 1 / sqrt(head_dim)), so a missed one shows. The hybrids' config.json names the
  layer types as the Granite 4 releases do ("mamba", "attention").
* :func:`granite_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py``
  does (``GraniteModel``, ``GraniteMoeModel``, ``GraniteHybridModel``: names from gguf-py's
  tensor map, Q/K rows permuted, the MoE's and the shared MLP's fused gate/up cut, Mamba2's
  A = -exp(A_log), D and the norm reshaped, conv squeezed), checked against the real converter
  by benchmarks/check_tiny_granite_converter.py.
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

KINDS = ("granite", "granitemoe", "granitemoeshared", "hybrid", "hybrid-moe")
_COMMON = {
    "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_theta": 10000.0,
    "embedding_multiplier": 12.0, "attention_multiplier": 0.0625, "residual_multiplier": 0.22,
    "logits_scaling": 2.5,
}
_MOE = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}
_HYBRID = {
    "layer_types": ["mamba", "mamba", "attention", "mamba"], "position_embedding_type": "nope",
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16,
}
_KINDS = {  # kind → (transformers class, its config fields)
    "granite": ("Granite", {"intermediate_size": 128}),
    "granitemoe": ("GraniteMoe", _MOE),
    "granitemoeshared": ("GraniteMoeShared", dict(_MOE, shared_intermediate_size=96)),
    "hybrid": ("GraniteMoeHybrid", dict(_HYBRID, num_local_experts=0, intermediate_size=128,
                                        shared_intermediate_size=128)),
    "hybrid-moe": ("GraniteMoeHybrid", dict(_HYBRID, **_MOE, shared_intermediate_size=96)),
}
_CONV_STD = 0.5  # a depthwise kernel of 4 taps: large enough that the conv mixes tokens


def make_granite_hf_model(kind: str, out_dir: str | Path, seed: int = 0,
                          save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Build a tiny random Granite model of ``kind`` (``KINDS``) and save it with the tiny
    tokenizer to ``out_dir``; ``overrides`` replace config fields (``tie_word_embeddings=True``,
    ``layer_types=...``). Returns ``out_dir``."""
    import transformers
    from transformers import GenerationConfig

    if kind not in _KINDS:
        raise ValueError(f"unknown Granite kind {kind!r}; known: {KINDS}")
    name, fields = _KINDS[kind]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(_COMMON, **fields, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    fields.update(overrides)
    config = getattr(transformers, f"{name}Config")(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForCausalLM")(config).to(torch.float32)
    _randomize_granite_(model, seed)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.to(save_dtype).save_pretrained(str(out_dir))
    if "layer_types" in fields:
        _release_layer_types(out_dir / "config.json", fields["layer_types"])
    return out_dir


def _randomize_granite_(model: torch.nn.Module, seed: int) -> None:
    """``_randomize_``, then Mamba2's parameters as trained ones look: A = exp(A_log) in
    [0.05, 1] and dt_bias ~ N(0, 0.5), so a step keeps 0.3 to 0.9 of the state (the recurrence
    matters over a few tokens), D ~ N(1, 0.1), and a conv kernel that mixes tokens."""
    _randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.copy_(torch.empty(param.shape).uniform_(0.05, 1.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith("mamba.D"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                param.copy_(_CONV_STD * torch.randn(param.shape, generator=gen))


def _release_layer_types(path: Path, layer_types: list[str]) -> None:
    """config.json as the Granite 4 releases write it: ``layer_types`` "mamba" / "attention"
    (transformers 5 saves its own names, which llama.cpp's converter does not read) and no
    ``time_step_limit`` (the default (0, inf); transformers 5 saves infinity as an object)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    names = {"linear_attention": "mamba", "full_attention": "attention"}
    config["layer_types"] = [names.get(t, t) for t in layer_types]
    config.pop("time_step_limit", None)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------

_GGUF_ARCH = {"GraniteForCausalLM": "granite", "GraniteMoeForCausalLM": "granitemoe",
              "GraniteMoeSharedForCausalLM": "granitemoe",
              "GraniteMoeHybridForCausalLM": "granitehybrid"}
_LAYER_NAMES = {  # transformers' name in a layer → llama.cpp's
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
    "mamba.in_proj.weight": "ssm_in.weight", "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias", "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a", "mamba.D": "ssm_d", "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
}
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
              "output_norm.weight", "lm_head.weight": "output.weight"}


def _convert(name: str, w: np.ndarray, config: dict) -> list[tuple[str, np.ndarray]]:
    """One tensor of the folder → its (GGUF name, array) pairs: Q/K rows permuted
    (``LlamaModel``), the fused gate/up of the experts and of the shared MLP cut
    (``GraniteMoeModel``), Mamba2's A_log, D, conv and norm transformed (``Mamba2Model``)."""
    if name in _TOP_NAMES:
        return [(_TOP_NAMES[name], w)]
    _, _, layer, rest = name.split(".", 3)
    prefix = f"blk.{layer}."
    if rest.endswith(("input_linear.weight", "shared_mlp.output_linear.weight")):
        kind = "_exps" if "block_sparse_moe" in rest else (
            "_shexp" if config.get("num_local_experts") else "")
        if rest.endswith("output_linear.weight"):
            return [(f"{prefix}ffn_down{kind}.weight", w)]
        gate, up = np.split(w, 2, axis=-2)
        return [(f"{prefix}ffn_gate{kind}.weight", gate), (f"{prefix}ffn_up{kind}.weight", up)]
    if rest == "self_attn.q_proj.weight":
        w = permute_qk(w, config["num_attention_heads"])
    elif rest == "self_attn.k_proj.weight":
        w = permute_qk(w, config["num_key_value_heads"])
    elif rest == "mamba.A_log":
        w = -torch.exp(torch.from_numpy(w)).numpy().reshape(-1, 1)  # torch's exp, to the bit
    elif rest == "mamba.D":
        w = w.reshape(-1, 1)
    elif rest == "mamba.conv1d.weight":
        w = w.squeeze()
    elif rest == "mamba.norm.weight":
        w = w.reshape(config["mamba_n_groups"], -1)
    return [(prefix + _LAYER_NAMES[rest], w)]


def _qtype(name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's choice: 1-D tensors, norms, ssm_conv1d, the routers and names not
    ending in ``.weight`` (ssm_a, ssm_d) stay F32; the other matrices take ``ftype``."""
    if (w.ndim <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name
            or ".ffn_gate_inp" in name or not name.endswith(".weight")):
        return "F32"
    return ftype


def _add_hparams(writer, config: dict, arch: str, ftype: str) -> None:
    """The keys TextModel, LlamaModel, GraniteModel, GraniteMoeModel and GraniteHybridModel
    write."""
    import gguf

    hybrid = arch == "granitehybrid"
    layer_types = config.get("layer_types") or []
    rope = config.get("rope_parameters") or {}
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-granite")  # the converter's: from the folder name
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    # no RoPE in a hybrid: llama.cpp's context is then "unbounded"
    writer.add_context_length(2**20 if hybrid else config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    kv = config["num_key_value_heads"]
    writer.add_head_count_kv([kv if t == "attention" else 0 for t in layer_types] if hybrid
                             else kv)
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "num_local_experts" in config:
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_vocab_size(_vocab_size(config, arch))
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_attention_scale(config["attention_multiplier"])
    writer.add_embedding_scale(config["embedding_multiplier"])
    writer.add_residual_scale(config["residual_multiplier"])
    writer.add_logit_scale(config["logits_scaling"])
    if config.get("shared_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])
    if hybrid:
        inner = config["mamba_expand"] * config["hidden_size"]
        writer.add_ssm_conv_kernel(config["mamba_d_conv"])
        writer.add_ssm_state_size(config["mamba_d_state"])
        writer.add_ssm_group_count(config["mamba_n_groups"])
        writer.add_ssm_inner_size(inner)
        writer.add_ssm_time_step_rank(config["mamba_n_heads"])
        writer.add_rope_scaling_finetuned(False)


def _vocab_size(config: dict, arch: str) -> int:
    """``Mamba2Model.set_vocab``: a hybrid's vocabulary padded to a multiple of 8."""
    size = config["vocab_size"]
    return -(size // -8) * 8 if arch == "granitehybrid" else size


def granite_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_granite_hf_model` into the GGUF file llama.cpp's
    converter writes (``granite``, ``granitemoe`` or ``granitehybrid``): ``ftype`` F32, F16,
    BF16 or Q8_0 for the matrices (``_qtype``). Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    arch = _GGUF_ARCH[config["architectures"][0]]
    tensors = {}
    for name, w in _load_state_dict(hf_dir).items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        tensors.update(_convert(name, w, config))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), arch)
    _add_hparams(writer, config, arch, ftype)
    _add_tokenizer(writer, hf_dir, _vocab_size(config, arch))
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
