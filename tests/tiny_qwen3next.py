"""Tiny random Qwen3-Next models (Gated DeltaNet + gated attention, 3:1, every MLP a sparse MoE
block with a gated shared expert), as Hugging Face folders and as GGUF files, for load and
logit-parity tests.

* :func:`make_qwen3next_hf_model` builds a ``Qwen3NextForCausalLM`` with transformers' own class
  (4 layers: three ``linear_attention``, one ``full_attention``; 2 key / 4 value heads, so the
  fused projections' per-key-head interleave shows; 8 experts, top-2, width 32, a shared expert
  of width 96) and saves it with the tiny tokenizer of tiny_models.py, its experts one tensor
  each as ``save_pretrained`` writes them (and the release does). ``mtp=True`` adds a one-layer
  MTP block (``mtp.*``) as the release carries one (config.json does not count it).
* :func:`qwen3next_hf_to_gguf` writes such a folder as llama.cpp's ``convert_hf_to_gguf.py``
  does for the ``qwen3next`` architecture (its ``Qwen3NextModel``: ``in_proj_qkvz`` split into
  ``attn_qkv`` and ``attn_gate``, ``in_proj_ba`` as it is; Qwen2-MoE's expert merge; the MTP
  block renamed to a block after the decoder's), checked against the real converter by
  benchmarks/check_tiny_qwen3next_converter.py. ``legacy=True`` writes ``in_proj_qkvz`` whole
  as ``ssm_in``, as the converter did before that split (llama.cpp still loads such files).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_hybrid import _merge_experts, _nextn_name, _qtype, _randomize_qwen35_, _text_names
from tiny_models import (
    _FILE_TYPES,
    EOS_TOKEN,
    PAD_TOKEN,
    _add_tensor,
    _add_tokenizer,
    _load_state_dict,
    save_tokenizer,
)

LINEAR, FULL = "linear_attention", "full_attention"
QWEN3NEXT_DEFAULTS = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "layer_types": [LINEAR, LINEAR, LINEAR, FULL],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 96, "norm_topk_prob": True,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.25},
}


def make_qwen3next_hf_model(out_dir: str | Path, seed: int = 0, *, mtp: bool = False,
                            save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Build a tiny random Qwen3-Next model and save it with the tiny tokenizer to ``out_dir``;
    ``overrides`` replace config fields (``tie_word_embeddings=True``,
    ``mlp_only_layers=[1]``). Returns ``out_dir``."""
    from transformers import GenerationConfig, Qwen3NextConfig, Qwen3NextForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    fields = dict(QWEN3NEXT_DEFAULTS, vocab_size=len(tokenizer), bos_token_id=None,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    fields.update(overrides)
    config = Qwen3NextConfig(**fields)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.float32)
    _randomize_qwen35_(model, seed)  # the same (1 + w) norms, gated norm, A, dt and conv
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.to(save_dtype).save_pretrained(str(out_dir))
    if mtp:
        _add_mtp(out_dir, config, seed, save_dtype)
    return out_dir


def _add_mtp(out_dir: Path, config, seed: int, dtype: torch.dtype) -> None:
    """Add the ``mtp.*`` tensors of a one-layer MTP block (the release's names and shapes: a
    full-attention decoder layer with a sparse MoE MLP, the fc over [embedding, hidden] and its
    norms) to the folder's safetensors file; transformers' class drops them at load."""
    from safetensors.torch import load_file, save_file

    hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim, width = config.head_dim, config.moe_intermediate_size
    shared = config.shared_expert_intermediate_size
    shapes = {"fc.weight": (hidden, 2 * hidden), "pre_fc_norm_embedding.weight": (hidden,),
              "pre_fc_norm_hidden.weight": (hidden,), "norm.weight": (hidden,)}
    layer = {"input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
             "self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
             "self_attn.k_proj.weight": (kv * head_dim, hidden),
             "self_attn.v_proj.weight": (kv * head_dim, hidden),
             "self_attn.o_proj.weight": (hidden, heads * head_dim),
             "self_attn.q_norm.weight": (head_dim,), "self_attn.k_norm.weight": (head_dim,),
             "mlp.gate.weight": (config.num_experts, hidden),
             "mlp.shared_expert_gate.weight": (1, hidden),
             "mlp.shared_expert.gate_proj.weight": (shared, hidden),
             "mlp.shared_expert.up_proj.weight": (shared, hidden),
             "mlp.shared_expert.down_proj.weight": (hidden, shared)}
    for e in range(config.num_experts):
        layer.update({f"mlp.experts.{e}.gate_proj.weight": (width, hidden),
                      f"mlp.experts.{e}.up_proj.weight": (width, hidden),
                      f"mlp.experts.{e}.down_proj.weight": (hidden, width)})
    shapes.update({f"layers.0.{k}": v for k, v in layer.items()})
    gen = torch.Generator().manual_seed(seed + 3)
    path = out_dir / "model.safetensors"
    state = load_file(str(path))
    for name, shape in shapes.items():
        state[f"mtp.{name}"] = (0.1 * torch.randn(shape, generator=gen)).to(dtype)
    save_file(state, str(path), metadata={"format": "pt"})


# --------------------------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py writes it
# --------------------------------------------------------------------------------------------

def split_qkvz(w: np.ndarray, config: dict) -> tuple[np.ndarray, np.ndarray]:
    """``Qwen3NextModel.modify_tensors`` on ``in_proj_qkvz``: rows per key head
    ``[q_h | k_h | v_h | z_h]`` → (``[q | k | v]``, ``z``), each part in key-head order."""
    num_k, num_v = config["linear_num_key_heads"], config["linear_num_value_heads"]
    k_dim, v_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    per_head = num_v // num_k * v_dim
    grouped = w.reshape(num_k, 2 * k_dim + 2 * per_head, -1)
    q, k, v, z = np.split(grouped, np.cumsum([k_dim, k_dim, per_head]), axis=1)
    hidden = w.shape[1]
    return (np.concatenate([p.reshape(-1, hidden) for p in (q, k, v)]), z.reshape(-1, hidden))


def _convert(name: str, w: np.ndarray, config: dict, legacy: bool) -> list[tuple[str, np.ndarray]]:
    """One tensor through ``Qwen3NextModel.modify_tensors`` (A_log → -exp(A_log), dt_bias →
    dt_proj.bias, conv1d squeezed, the 1 + w norms stored as 1 + w, in_proj_qkvz split unless
    ``legacy``): (name, array) pairs, HF-named except the split's GGUF-named two."""
    if name.endswith(".A_log"):
        w = -torch.exp(torch.from_numpy(w)).numpy()  # torch's exp, to the bit
    elif name.endswith(".dt_bias"):
        name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
    elif "conv1d" in name:
        w = w.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        w = w + 1.0
    if "in_proj_qkvz.weight" in name and not legacy:
        layer = name.split(".")[2]
        qkv, z = split_qkvz(w, config)
        return [(f"blk.{layer}.attn_qkv.weight", qkv), (f"blk.{layer}.attn_gate.weight", z)]
    return [(name, w)]


def num_mtp_layers(state: dict) -> int:
    """``_QwenMtpMixin``'s count for a config without ``mtp_num_hidden_layers`` (Qwen3-Next's):
    one more than the largest ``mtp.layers.i`` index."""
    indices = {int(n.split(".")[2]) for n in state if n.startswith("mtp.layers.")}
    return max(indices) + 1 if indices else 0


def _gguf_tensors(state: dict[str, np.ndarray], config: dict,
                  legacy: bool) -> dict[str, np.ndarray]:
    """GGUF name → float32 array of each tensor of the folder's ``state``."""
    import gguf

    num_layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3NEXT,
                                     num_layers + num_mtp_layers(state))
    tensors = {}
    for hf_name, weight in _merge_experts(state, False).items():
        text_name = _text_names(hf_name, num_layers)
        if text_name is None or (text_name == "lm_head.weight"
                                 and config["tie_word_embeddings"]):
            continue
        for name, w in _convert(text_name, weight, config, legacy):
            gguf_name = (name if name.startswith("blk.") else
                         names.get_name(name, try_suffixes=(".weight", ".bias"))
                         or _nextn_name(name))
            if gguf_name is None:
                raise KeyError(f"no GGUF name for tensor {hf_name!r}")
            tensors[gguf_name] = w
    return tensors


def _add_hparams(writer, config: dict, ftype: str, num_mtp: int) -> None:
    """The keys TextModel, Qwen2MoeModel, _QwenMtpMixin and Qwen3NextModel write."""
    import gguf

    rope = config["rope_parameters"]
    num_layers = config["num_hidden_layers"]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name("tiny-qwen3next")  # the converter's: from the folder name
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(num_layers + num_mtp)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if num_mtp:
        writer.add_nextn_predict_layers(num_mtp)
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
    writer.add_ssm_inner_size(config["linear_value_head_dim"] * config["linear_num_value_heads"])
    if config.get("layer_types") is not None:  # (gguf-py 0.19 has no add_recurrent_layers)
        recurrent = [t == LINEAR for t in config["layer_types"]] + [False] * num_mtp
        writer.add_array(f"{writer.arch}.attention.recurrent_layers", recurrent)
    writer.add_full_attention_interval(config.get("full_attention_interval", 4))
    writer.add_rope_dimension_count(int(config["head_dim"]
                                        * rope.get("partial_rotary_factor", 0.25)))


def qwen3next_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32", *,
                         legacy: bool = False) -> Path:
    """Convert a folder written by :func:`make_qwen3next_hf_model` into a ``qwen3next`` GGUF
    file: ``ftype`` F32, F16, BF16 or Q8_0 for the matrices (tiny_hybrid's ``_qtype``), its
    MTP block included when the folder has one (as the converter without ``--no-mtp``);
    ``legacy``: ``in_proj_qkvz`` whole as ``ssm_in``. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "BF16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'BF16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    state = _load_state_dict(hf_dir)
    num_mtp = num_mtp_layers(state)
    tensors = _gguf_tensors(state, config, legacy)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "qwen3next")
    _add_hparams(writer, config, ftype, num_mtp)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, _qtype(name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
