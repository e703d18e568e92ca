"""Tiny random Nemotron-H models (Mamba2, attention and squared-ReLU MLP / MoE blocks), as
Hugging Face folders and as GGUF files, for load and logit-parity tests.

* :func:`make_nemotron_h_hf_model` builds a ``NemotronHForCausalLM`` with transformers' own
  class: the dense layout (``DENSE_PATTERN``: Mamba2 ``M``, attention ``*``, MLP ``-``) or,
  with ``moe=True``, Nemotron 3 Nano's (``MOE_PATTERN``: MoE blocks ``E`` of 8 squared-ReLU
  experts in 4 groups, 2 groups and top-2 kept, a shared expert, routed scaling 2.5), and saves
  it with the tiny tokenizer of tiny_models.py. Its config.json is written as the releases write
  theirs (``hybrid_override_pattern``, ``num_hidden_layers``; a dense model without MoE keys),
  its tensors as ``save_pretrained`` writes them (``backbone.*``, one tensor per expert).
* :func:`nemotron_h_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py``
  does (its ``NemotronHModel`` over ``GraniteHybridModel`` and ``Mamba2Model``: names from
  gguf-py's own tensor map), checked against the real converter by
  benchmarks/check_tiny_nemotron_h_converter.py.
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
    permute_qk,
    save_tokenizer,
)

DENSE_PATTERN = "M-*M-M-"
MOE_PATTERN = "ME*EME"
_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
NEMOTRON_H_DEFAULTS = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 8,
    "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
NEMOTRON_H_MOE_DEFAULTS = {
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 64, "n_group": 4, "topk_group": 2,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True,
}
_CONV_STD = 0.5  # a depthwise kernel of 4 taps: large enough that the conv mixes tokens


def make_nemotron_h_hf_model(out_dir: str | Path, seed: int = 0, *, moe: bool = False,
                             save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Build a tiny random Nemotron-H and save it with the tiny tokenizer to ``out_dir``;
    ``overrides`` replace config fields (``hybrid_override_pattern="M*-"``). Returns
    ``out_dir``."""
    from transformers import GenerationConfig, NemotronHConfig, NemotronHForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(NEMOTRON_H_DEFAULTS, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id,
                  hybrid_override_pattern=MOE_PATTERN if moe else DENSE_PATTERN)
    if moe:
        fields.update(NEMOTRON_H_MOE_DEFAULTS)
    fields.update(overrides)
    pattern = fields.pop("hybrid_override_pattern")
    config = NemotronHConfig(layers_block_type=[_BLOCKS[c] for c in pattern], **fields)
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).to(torch.float32)
    _randomize_nemotron_h_(model, seed)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.to(save_dtype).save_pretrained(str(out_dir))
    _as_released_config(out_dir / "config.json", pattern, moe)
    return out_dir


def _as_released_config(path: Path, pattern: str, moe: bool) -> None:
    """config.json as the releases have it: the pattern string and ``num_hidden_layers`` in
    place of ``layers_block_type``; a dense model's without the MoE keys transformers writes
    for every model (llama.cpp's converter takes ``num_experts_per_tok`` for a MoE)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    del config["layers_block_type"]
    config.update(hybrid_override_pattern=pattern, num_hidden_layers=len(pattern))
    if not moe:
        for key in (*NEMOTRON_H_MOE_DEFAULTS, "n_shared_experts", "moe_latent_size",
                    "moe_shared_expert_overlap", "mtp_layers_block_type"):
            config.pop(key, None)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def _randomize_nemotron_h_(model: torch.nn.Module, seed: int) -> None:
    """``_randomize_`` (norms N(1, s), the gated Mamba2 norm among them), then what it cannot
    know: A = exp(A_log) in [0.05, 1] and dt_bias ~ N(0, 0.5), so a step keeps 0.3 to 0.95 of
    the state; D around 1; a conv kernel that mixes tokens; a router correction bias that moves
    the choice (a buffer, not a parameter)."""
    _randomize_(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.copy_(torch.empty(param.shape).uniform_(0.05, 1.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".D"):
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                param.copy_(_CONV_STD * torch.randn(param.shape, generator=gen))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------


def _convert(name: str, w: np.ndarray, config: dict) -> tuple[str, np.ndarray]:
    """One tensor through the converter's renames and transforms (``Mamba2Model``:
    A_log → -exp(A_log) [H, 1], D [H, 1], conv1d squeezed, the gated norm [groups, -1],
    dt_bias → dt_proj.bias; ``LlamaModel``: q/k rows permuted; the router bias as
    ``e_score_correction.bias``); HF name, not yet GGUF's."""
    if name.endswith(".A_log"):
        w = -torch.exp(torch.from_numpy(w)).numpy().reshape(-1, 1)  # torch's exp, to the bit
    elif name.endswith(".D"):
        w = w.reshape(-1, 1)
    elif name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    elif name.endswith("conv1d.weight"):
        w = w.squeeze()
    elif name.endswith("mixer.norm.weight"):
        w = w.reshape(config["n_groups"], -1)
    elif name.endswith("mixer.q_proj.weight"):
        w = permute_qk(w, config["num_attention_heads"])
    elif name.endswith("mixer.k_proj.weight"):
        w = permute_qk(w, config["num_key_value_heads"])
    elif name.endswith("e_score_correction_bias"):
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    return name, w


def _merge_experts(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``NemotronHModel.modify_tensors`` on the experts: each layer's stacked
    [E, rows, cols] as ``model.layers.N.mlp.experts.{up,down}_proj.weight``."""
    out, per_expert = {}, {}
    for name, w in state.items():
        prefix, sep, rest = name.partition(".mixer.experts.")
        if not sep:
            out[name] = w
            continue
        expert, part = rest.split(".", 1)
        layer = prefix.removeprefix("backbone.layers.")
        per_expert.setdefault(f"model.layers.{layer}.mlp.experts.{part}", {})[int(expert)] = w
    for name, by_expert in per_expert.items():
        out[name] = np.stack([by_expert[e] for e in range(len(by_expert))])
    return out


def _gguf_tensors(state: dict[str, np.ndarray], config: dict, arch) -> dict[str, np.ndarray]:
    """GGUF name → float32 array of each tensor of the folder's ``state``."""
    import gguf

    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    tensors = {}
    for hf_name, w in _merge_experts(state).items():
        name, w = _convert(hf_name, w, config)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {hf_name!r}")
        tensors[gguf_name] = w
    return tensors


def _add_hparams(writer, config: dict, ftype: str) -> None:
    """The keys TextModel, LlamaModel, GraniteHybridModel and NemotronHModel write (the later
    ones overwriting the earlier: the per-layer KV heads and widths, context 2**20)."""
    import gguf

    pattern, moe = config["hybrid_override_pattern"], _is_moe(config)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    width = config["moe_intermediate_size"] if moe else config["intermediate_size"]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-nemotron-h")  # the converter's: from the folder name
    writer.add_block_count(len(pattern))
    writer.add_context_length(2**20)  # arbitrary: no rope
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length([width if c == ("E" if moe else "-") else 0 for c in pattern])
    writer.add_head_count(heads)
    writer.add_head_count_kv([config["num_key_value_heads"] if c == "*" else 0 for c in pattern])
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    if moe:  # TextModel's expert keys
        writer.add_expert_count(config["n_routed_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(hidden // heads)  # GraniteModel drops head_dim first
    writer.add_ssm_conv_kernel(config["conv_kernel"])
    writer.add_ssm_state_size(config["ssm_state_size"])
    writer.add_ssm_group_count(config["n_groups"])
    writer.add_ssm_inner_size(config["mamba_num_heads"] * config["mamba_head_dim"])
    writer.add_ssm_time_step_rank(config["mamba_num_heads"])
    writer.add_rope_scaling_finetuned(False)
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    if moe:  # NemotronHModel's
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(
            config["moe_shared_expert_intermediate_size"])
        writer.add_expert_shared_count(config.get("n_shared_experts", 1))
        writer.add_expert_weights_norm(config["norm_topk_prob"])
        writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _is_moe(config: dict) -> bool:
    return "num_experts_per_tok" in config


def nemotron_h_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_nemotron_h_hf_model` into a ``nemotron_h`` GGUF
    file (a MoE one into ``nemotron_h_moe``): ``ftype`` F32, F16, BF16 or Q8_0 for the
    matrices (tiny_hybrid's ``_qtype``: norms, the conv, the router and ``ssm_a`` / ``ssm_d``
    stay F32). Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    moe = _is_moe(config)
    arch = gguf.MODEL_ARCH.NEMOTRON_H_MOE if moe else gguf.MODEL_ARCH.NEMOTRON_H
    tensors = _gguf_tensors(_load_state_dict(hf_dir), config, arch)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), gguf.MODEL_ARCH_NAMES[arch])
    _add_hparams(writer, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
