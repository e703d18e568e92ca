"""Tiny random Qwen3.5 models (hybrid: Gated DeltaNet and gated-attention layers), as Hugging
Face folders and as GGUF files, for load and logit-parity tests.

* :func:`make_qwen35_hf_model` builds a ``Qwen3_5ForCausalLM`` with transformers' own class
  (4 layers: three ``linear_attention``, one ``full_attention``; GVA with 2 key / 4 value
  heads, so llama.cpp's V-head reordering shows) and saves it with the tiny tokenizer of
  tiny_models.py. ``conditional=True`` saves the same text weights as a
  ``Qwen3_5ForConditionalGeneration`` folder (``model.language_model.*`` and a tiny random
  ``model.visual.*``); ``mtp=True`` adds a multi-token-prediction block (``mtp.*``) as the
  Qwen3.5 releases carry one.
* :func:`make_qwen35_moe_hf_model`: the same with transformers' ``Qwen3_5MoeForCausalLM`` (every
  MLP a sparse MoE block: 8 experts, top-2, width 32, a shared expert of width 96 and its
  sigmoid gate), its experts saved fused 3-D as the Qwen3.5-MoE releases store them.
* :func:`qwen35_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py`` does
  for the ``qwen35`` / ``qwen35moe`` architectures (its ``Qwen3_5TextModel`` /
  ``Qwen3_5MoeTextModel`` with the ``Qwen3NextModel``, ``Qwen2MoeModel`` and
  ``_LinearAttentionVReorderBase`` transforms; names from gguf-py's own tensor map), checked
  against the real converter by benchmarks/check_tiny_gguf_converter.py.
"""

from __future__ import annotations

import copy
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

LINEAR, FULL = "linear_attention", "full_attention"
QWEN35_TEXT_DEFAULTS = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    # the Qwen3.5 releases' layout: interleaved mRoPE sections over the rotary half-dims
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                        "mrope_interleaved": True},
}
QWEN35_MOE_DEFAULTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "shared_expert_intermediate_size": 96}
_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
           "patch_size": 4, "num_position_embeddings": 16}
_CONV_STD = 0.5  # a depthwise kernel of 4 taps: large enough that the conv mixes tokens


def make_qwen35_hf_model(out_dir: str | Path, seed: int = 0, *, conditional: bool = False,
                         mtp: bool = False, save_dtype: torch.dtype = torch.float32,
                         **overrides) -> Path:
    """Build a tiny random Qwen3.5 text model and save it with the tiny tokenizer to
    ``out_dir``; ``overrides`` replace text-config fields (``tie_word_embeddings=True``,
    ``layer_types=...``). The text weights depend on ``seed`` and ``overrides`` only, so the
    ``conditional`` folder holds the same text model. Returns ``out_dir``."""
    return _make(out_dir, seed, False, conditional, mtp, save_dtype, overrides)


def make_qwen35_moe_hf_model(out_dir: str | Path, seed: int = 0, *, conditional: bool = False,
                             fused: bool = True, mtp: bool = False,
                             save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """:func:`make_qwen35_hf_model` for the MoE model (``QWEN35_MOE_DEFAULTS``); ``fused``: the
    experts as the releases store them (``mlp.experts.gate_up_proj`` [E, 2 * width, hidden],
    ``mlp.experts.down_proj``), else one tensor per expert as ``save_pretrained`` writes them."""
    return _make(out_dir, seed, True, conditional, mtp, save_dtype, overrides, fused)


def _make(out_dir, seed: int, moe: bool, conditional: bool, mtp: bool, save_dtype,
          overrides: dict, fused: bool = False) -> Path:
    """Build, randomize and save a tiny dense (``Qwen3_5*``) or MoE (``Qwen3_5Moe*``) model."""
    import transformers
    from transformers import GenerationConfig

    kind = "Qwen3_5Moe" if moe else "Qwen3_5"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(QWEN35_TEXT_DEFAULTS, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    if moe:
        del fields["intermediate_size"]
        fields.update(QWEN35_MOE_DEFAULTS)
    fields.update(overrides)
    if mtp:
        fields["mtp_num_hidden_layers"] = 1
    config = getattr(transformers, f"{kind}TextConfig")(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{kind}ForCausalLM")(config).to(torch.float32)
    _randomize_qwen35_(model, seed)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    if conditional:
        model = _as_conditional(model, seed, kind)
    model.to(save_dtype).save_pretrained(str(out_dir))
    if fused:
        _fuse_experts(out_dir / "model.safetensors", model)
    if mtp:
        _add_mtp(out_dir, config, seed, save_dtype, kind)
    return out_dir


def _fuse_experts(path: Path, model) -> None:
    """Rewrite the saved file with each layer's experts as transformers holds them in memory
    (and the releases store them): two 3-D tensors, not ``save_pretrained``'s one per expert."""
    from safetensors.torch import load_file, save_file

    state = {k: v for k, v in load_file(str(path)).items() if ".mlp.experts." not in k}
    state.update({k: v.contiguous() for k, v in model.state_dict().items()
                  if ".mlp.experts." in k})
    save_file(state, str(path), metadata={"format": "pt"})


def _randomize_qwen35_(model: torch.nn.Module, seed: int) -> None:
    """``_randomize_`` with Qwen3.5's norms (1 + w: mean 0), then what it cannot know: the
    gated norm of the DeltaNet output multiplies by w itself (mean 1), A = exp(A_log) in
    [0.05, 1] and dt_bias ~ N(0, 0.5), so a step keeps 0.3 to 0.9 of the state (the
    recurrence matters over a few tokens), and a conv kernel that mixes tokens."""
    _randomize_(model, seed, norm_mean=0.0)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("A_log"):
                param.copy_(torch.empty(param.shape).uniform_(0.05, 1.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                param.copy_(_CONV_STD * torch.randn(param.shape, generator=gen))


def _as_conditional(text_model, seed: int, kind: str):
    """The ``{kind}ForConditionalGeneration`` holding ``text_model``'s weights and a tiny
    random vision tower."""
    import transformers

    text = text_model.config.to_dict()
    vision = dict(_VISION, out_hidden_size=text["hidden_size"])
    config = getattr(transformers, f"{kind}Config")(
        text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"])
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).to(torch.float32)
    _randomize_(model.model.visual, seed + 2)
    state = {k.replace("model.", "model.language_model.", 1): v
             for k, v in text_model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("model.visual.") for k in missing), missing
    model.generation_config = text_model.generation_config
    return model.eval()


def _add_mtp(out_dir: Path, config, seed: int, dtype: torch.dtype, kind: str) -> None:
    """Add the ``mtp.*`` tensors of a one-layer MTP block (the Qwen3.5 releases' names and
    shapes: a full-attention decoder layer of the model's kind, dense or MoE with its experts
    fused as the releases store them, the fc over [embedding, hidden] and its norms) to the
    folder's safetensors file; transformers' classes drop them at load."""
    import importlib

    from safetensors.torch import load_file, save_file

    module = "qwen3_5_moe" if kind == "Qwen3_5Moe" else "qwen3_5"
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    layer_config = copy.deepcopy(config)
    layer_config.layer_types = list(config.layer_types) + ["full_attention"]
    layer = getattr(modeling, f"{kind}DecoderLayer")(layer_config, config.num_hidden_layers)
    _randomize_(layer.float(), seed + 3, norm_mean=0.0)
    hidden = config.hidden_size
    gen = torch.Generator().manual_seed(seed + 4)
    own = {"fc.weight": 0.1 * torch.randn((hidden, 2 * hidden), generator=gen)}
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        own[f"{norm}.weight"] = 0.1 * torch.randn((hidden,), generator=gen)
    own.update({f"layers.0.{k}": v for k, v in layer.state_dict().items()})
    path = out_dir / "model.safetensors"
    state = load_file(str(path))
    state.update({f"mtp.{k}": v.detach().to(dtype).contiguous() for k, v in own.items()})
    save_file(state, str(path), metadata={"format": "pt"})


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------

_NEXTN = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
          "norm": "shared_head.norm"}  # _QwenMtpMixin's renames of the MTP block's own tensors


def _text_names(name: str, num_layers: int) -> str | None:
    """The converter's ``filter_tensors``: vision tensors dropped, ``language_model.`` removed,
    ``mtp.layers.i.*`` → ``model.layers.{num_layers + i}.*``, the MTP block's own tensors →
    the nextn names of that layer."""
    if "visual." in name:
        return None
    name = name.replace("language_model.", "")
    if not name.startswith("mtp."):
        return name
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers":
        return f"model.layers.{num_layers + int(parts[2])}.{parts[3]}"
    return f"model.layers.{num_layers}.{_NEXTN[parts[1]]}.{parts[2]}"


def reorder_v_heads(w: np.ndarray, axis: int, num_k: int, num_v: int, head_dim: int) -> np.ndarray:
    """``_LinearAttentionVReorderBase._reorder_v_heads``: V heads grouped by key head
    ``[k0v0, k0v1, k1v0, k1v1]`` → tiled ``[k0v0, k1v0, k0v1, k1v1]`` along ``axis``."""
    axis %= w.ndim
    shape = w.shape
    grouped = w.reshape(shape[:axis] + (num_k, num_v // num_k, head_dim) + shape[axis + 1:])
    return np.swapaxes(grouped, axis, axis + 1).reshape(shape)


def _convert(name: str, w: np.ndarray, text: dict) -> tuple[str, np.ndarray]:
    """One tensor through ``_LinearAttentionVReorderBase.modify_tensors`` (V heads tiled) and
    ``Qwen3NextModel.modify_tensors`` (A_log → -exp(A_log), dt_bias → dt_proj.bias, conv1d
    squeezed, the 1 + w norms stored as 1 + w); HF name, not yet GGUF's."""
    num_k, num_v = text["linear_num_key_heads"], text["linear_num_value_heads"]
    k_dim, v_dim = text["linear_key_head_dim"], text["linear_value_head_dim"]
    if num_k != num_v and "linear_attn." in name:
        qk = 2 * num_k * k_dim
        if ".in_proj_qkv." in name:
            w = np.concatenate([w[:qk], reorder_v_heads(w[qk:], 0, num_k, num_v, v_dim)])
        elif ".in_proj_z." in name:
            w = reorder_v_heads(w, 0, num_k, num_v, v_dim)
        elif ".in_proj_b." in name or ".in_proj_a." in name or name.endswith((".A_log",
                                                                               ".dt_bias")):
            w = reorder_v_heads(w, 0, num_k, num_v, 1)  # one per value head
        elif ".conv1d" in name:
            w = w.squeeze()
            w = np.concatenate([w[:qk], reorder_v_heads(w[qk:], 0, num_k, num_v, v_dim)])
        elif ".out_proj." in name:
            w = reorder_v_heads(w, 1, num_k, num_v, v_dim)
    if name.endswith(".A_log"):
        w = -torch.exp(torch.from_numpy(w)).numpy()  # torch's exp, to the bit
    elif name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    elif "conv1d" in name:
        w = w.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        w = w + 1.0
    return name, w


def _merge_experts(state: dict[str, np.ndarray], fuse_gate_up: bool) -> dict[str, np.ndarray]:
    """``Qwen2MoeModel.modify_tensors`` on the experts: each layer's as
    ``...mlp.experts.{gate,up,down}_proj.weight`` [E, rows, cols] (a fused ``gate_up_proj``
    cut in halves, per-expert matrices stacked); ``fuse_gate_up`` (``--fuse-gate-up-exps``):
    gate and up concatenated back as ``gate_up_proj``."""
    out, per_expert = {}, {}
    for name, w in state.items():
        prefix, sep, rest = name.partition(".mlp.experts.")
        if not sep:
            out[name] = w
        elif rest == "gate_up_proj":
            half = w.shape[1] // 2
            out[f"{prefix}{sep}gate_proj.weight"] = w[:, :half]
            out[f"{prefix}{sep}up_proj.weight"] = w[:, half:]
        elif rest == "down_proj":
            out[f"{prefix}{sep}down_proj.weight"] = w
        else:  # E.gate_proj.weight
            expert, part = rest.split(".", 1)
            per_expert.setdefault(f"{prefix}{sep}{part}", {})[int(expert)] = w
    for name, by_expert in per_expert.items():
        out[name] = np.stack([by_expert[e] for e in range(len(by_expert))])
    for gate in [n for n in out if fuse_gate_up and n.endswith(".experts.gate_proj.weight")]:
        up = out.pop(gate.replace("gate_proj", "up_proj"))
        out[gate.replace("gate_proj", "gate_up_proj")] = np.concatenate([out.pop(gate), up], 1)
    return out


def _gguf_tensors(state: dict[str, np.ndarray], text: dict,
                  fuse_gate_up: bool = False) -> dict[str, np.ndarray]:
    """GGUF name → float32 array of each tensor of the folder's ``state``."""
    import gguf

    num_layers = text["num_hidden_layers"]
    block_count = num_layers + text.get("mtp_num_hidden_layers", 0)
    arch = gguf.MODEL_ARCH.QWEN35MOE if _is_moe(text) else gguf.MODEL_ARCH.QWEN35
    names = gguf.get_tensor_name_map(arch, block_count)
    tensors = {}
    for hf_name, w in _merge_experts(state, fuse_gate_up).items():
        name = _text_names(hf_name, num_layers)
        if name is None or (name == "lm_head.weight" and text["tie_word_embeddings"]):
            continue
        name, w = _convert(name, w, text)
        gguf_name = (names.get_name(name, try_suffixes=(".weight", ".bias"))
                     or _nextn_name(name))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {hf_name!r}")
        tensors[gguf_name] = w
    return tensors


def _nextn_name(name: str) -> str | None:
    """gguf-py's name of an MTP block tensor (its QWEN35 tensor list may lack them)."""
    import gguf

    tensors = {"eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ, "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
               "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM,
               "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM}
    layer, _, rest = name.removeprefix("model.layers.").partition(".")
    base = rest.removesuffix(".weight")
    if base not in tensors:
        return None
    return gguf.TENSOR_NAMES[tensors[base]].format(bid=layer) + ".weight"


def _qtype(name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's choice: 1-D tensors, norms, ssm_conv1d, the routers (``ffn_gate_inp``,
    ``ffn_gate_inp_shexp``) and names not ending in ``.weight`` (``ssm_a``) stay F32; the other
    matrices take ``ftype``."""
    if (w.ndim <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name
            or ".ffn_gate_inp" in name or not name.endswith(".weight")):
        return "F32"
    return ftype


def _add_hparams(writer, text: dict, ftype: str) -> None:
    """The keys TextModel, _QwenMtpMixin, Qwen3NextModel and _Qwen35MRopeMixin write."""
    import gguf

    rope = text["rope_parameters"]
    num_layers = text["num_hidden_layers"]
    num_mtp = text.get("mtp_num_hidden_layers", 0)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-qwen35")  # the converter's: from the folder name
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(num_layers + num_mtp)
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    if "intermediate_size" in text:  # (a MoE config has none)
        writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    writer.add_rope_dimension_sections((sections + [0] * 4)[:4])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    if _is_moe(text):  # TextModel's expert keys, Qwen2MoeModel's widths
        writer.add_expert_count(text["num_experts"])
        writer.add_expert_used_count(text["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(text["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(text["shared_expert_intermediate_size"])
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    if num_mtp:
        writer.add_nextn_predict_layers(num_mtp)
    writer.add_ssm_conv_kernel(text["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(text["linear_key_head_dim"])
    writer.add_ssm_group_count(text["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(text["linear_num_value_heads"])
    writer.add_ssm_inner_size(text["linear_value_head_dim"] * text["linear_num_value_heads"])
    if text.get("layer_types") is not None:  # (gguf-py 0.19 has no add_recurrent_layers)
        recurrent = [t == LINEAR for t in text["layer_types"]] + [False] * num_mtp
        writer.add_array(f"{writer.arch}.attention.recurrent_layers", recurrent)
    writer.add_full_attention_interval(text.get("full_attention_interval", 4))
    writer.add_rope_dimension_count(int(text["head_dim"] * rope.get("partial_rotary_factor",
                                                                      0.25)))


def _is_moe(text: dict) -> bool:
    return "num_experts" in text


def text_config(config: dict) -> dict:
    """The converter's hparams: a ConditionalGeneration config's ``text_config`` over its top
    level."""
    return {**config, **config.get("text_config", {})}


def qwen35_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32",
                      fuse_gate_up_exps: bool = False) -> Path:
    """Convert a folder written by :func:`make_qwen35_hf_model` into a ``qwen35`` GGUF file (one
    of :func:`make_qwen35_moe_hf_model` into a ``qwen35moe`` one, ``fuse_gate_up_exps`` as the
    converter's flag): ``ftype`` F32, F16, BF16 or Q8_0 for the matrices (``_qtype``). Returns
    ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    text = text_config(config)
    tensors = _gguf_tensors(_load_state_dict(hf_dir), text, fuse_gate_up_exps)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "qwen35moe" if _is_moe(text) else "qwen35")
    _add_hparams(writer, text, ftype)
    _add_tokenizer(writer, hf_dir, text["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
