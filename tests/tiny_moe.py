"""Tiny random-weight mixture-of-experts models (Qwen2-MoE, Qwen3-MoE, Mixtral) as Hugging Face
folders and GGUF files, beside tiny_models.py (same tokenizer, weight scales and GGUF writer
pieces).

* :func:`make_moe_hf_model` writes a 2-layer ``qwen2_moe`` (8 experts, top-2, moe width 32, a
  shared expert of width 48 with its sigmoid gate, q/k/v bias, top-k weights not renormalized,
  as Qwen1.5-MoE), ``qwen3_moe`` (8 experts, top-2, moe width 32) or ``mixtral`` (4 experts,
  top-2) folder through transformers' own ``save_pretrained`` (per-expert
  ``experts.E.{gate,up,down}_proj`` / ``w1, w3, w2`` tensors, as hub checkpoints have them).
* :func:`moe_hf_to_gguf` converts it as llama.cpp's converter does: experts stacked into
  ``blk.N.ffn_{gate,up,down}_exps`` [n_expert, rows, cols], the router ``ffn_gate_inp`` kept F32
  (llama.cpp never quantizes it), the shared expert as ``ffn_{gate,up,down}_shexp`` and its gate
  ``ffn_gate_inp_shexp`` [hidden] (F32), ``qwen2moe`` / ``qwen3moe`` / ``llama`` (Mixtral: Q/K
  permuted) metadata.
* :func:`dequantized_reference` is the transformers model holding a GGUF file's weights exactly
  as ``gguf.quants.dequantize`` gives them (the reference of a quantized file).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tiny_models import (EOS_TOKEN, PAD_TOKEN, _add_hparams, _add_tensor, _add_tokenizer,
                         _load_json, _load_state_dict, _randomize_, permute_qk, save_tokenizer)

MOE_ARCHS = ("qwen2_moe", "qwen3_moe", "mixtral")
_GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
_QWEN_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
_EXPERT_PARTS = {"qwen2_moe": _QWEN_PARTS, "qwen3_moe": _QWEN_PARTS,
                 "mixtral": {"w1": "gate", "w3": "up", "w2": "down"}}
_LAYER = {"input_layernorm.weight": "attn_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.bias": "attn_v.bias",
          "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
          "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
          "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
          "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight",
          "mlp.gate.weight": "ffn_gate_inp.weight",
          "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def moe_config(arch: str, vocab_size: int, eos_id: int, pad_id: int, **overrides):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos_id,
                  pad_token_id=pad_id, num_experts_per_tok=2)
    if arch == "qwen2_moe":
        kwargs = dict(common, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                      shared_expert_intermediate_size=64, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=True)
        cls = Qwen2MoeConfig
    elif arch == "qwen3_moe":
        kwargs = dict(common, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        cls = Qwen3MoeConfig
    elif arch == "mixtral":
        kwargs = dict(common, intermediate_size=32, num_local_experts=4, sliding_window=None)
        cls = MixtralConfig
    else:
        raise ValueError(f"unknown MoE arch {arch!r}; expected one of {MOE_ARCHS}")
    kwargs.update(overrides)
    return cls(**kwargs)


def make_moe_hf_model(arch: str, out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """A tiny random MoE model of ``arch`` saved with the tiny tokenizer; returns ``out_dir``."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN))
    config = moe_config(arch, len(tokenizer), eos_id, pad_id, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.eval().save_pretrained(str(out_dir))
    return out_dir


def _gguf_tensors(arch: str, config: dict, state: dict[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """GGUF name → fp32 array: experts stacked per layer, Mixtral's Q/K permuted."""
    parts = _EXPERT_PARTS[arch]
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    out = {}
    for name, w in state.items():
        if name in _GLOBAL:
            out[_GLOBAL[name]] = w
            continue
        _, _, layer, rest = name.split(".", 3)
        bits = rest.split(".")
        if bits[1] == "experts":  # mlp.experts.E.gate_proj.weight
            experts.setdefault((int(layer), parts[bits[3]]), {})[int(bits[2])] = w
            continue
        if arch == "mixtral" and rest == "self_attn.q_proj.weight":
            w = permute_qk(w, config["num_attention_heads"])
        elif arch == "mixtral" and rest == "self_attn.k_proj.weight":
            w = permute_qk(w, config["num_key_value_heads"])
        elif rest == "mlp.shared_expert_gate.weight":  # llama.cpp's shape: [hidden]
            w = w.reshape(-1)
        out[f"blk.{layer}.{_LAYER[rest]}"] = w
    for (layer, part), by_expert in experts.items():
        out[f"blk.{layer}.ffn_{part}_exps.weight"] = np.stack(
            [by_expert[e] for e in range(len(by_expert))])
    return out


def moe_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a :func:`make_moe_hf_model` folder to GGUF (``ftype``: F32, F16, Q8_0, Q4_0 for
    the matrices; norms and the router stay F32)."""
    import gguf

    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = _load_json(hf_dir / "config.json")
    arch = config["model_type"]
    if arch not in MOE_ARCHS:
        raise ValueError(f"model_type {arch!r} not in {MOE_ARCHS}")
    tensors = _gguf_tensors(arch, config, _load_state_dict(hf_dir))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), _GGUF_ARCH[arch])
    _add_hparams(writer, _GGUF_ARCH[arch], config, ftype)
    writer.add_expert_count(config.get("num_experts") or config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    if arch in ("qwen2_moe", "qwen3_moe"):
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "qwen2_moe":
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
        if config.get("norm_topk_prob"):  # llama.cpp's qwen2moe default: not renormalized
            writer.add_expert_weights_norm(True)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name in sorted(tensors, key=_order):
        w = tensors[name]
        _add_tensor(writer, name, w, "F32" if "ffn_gate_inp" in name else ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _order(name: str) -> tuple:
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return ({"token_embd.weight": 0, "output_norm.weight": 2}.get(name, 3), 0, name)


def dequantized_reference(hf_dir: str | Path, gguf_path: str | Path):
    """The transformers model of ``hf_dir`` with every weight replaced by the GGUF file's,
    dequantized by ``gguf.quants`` (Mixtral's Q/K permutation undone). Written beside the file
    as a safetensors folder and loaded back, so transformers' own checkpoint conversion fuses
    the experts."""
    import gguf
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    hf_dir = Path(hf_dir)
    config = _load_json(hf_dir / "config.json")
    state = _load_state_dict(hf_dir)
    inverse = _hf_names(config["model_type"], config, state)
    new_state = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        for name, value in inverse[t.name](w).items():
            new_state[name] = torch.from_numpy(np.ascontiguousarray(value))
    assert set(new_state) == set(state), set(state) ^ set(new_state)
    out = Path(str(gguf_path) + ".reference")
    out.mkdir(exist_ok=True)
    for f in ("config.json", "generation_config.json"):
        (out / f).write_text((hf_dir / f).read_text())
    save_file(new_state, str(out / "model.safetensors"))
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


def _hf_names(arch: str, config: dict, state: dict) -> dict:
    """GGUF tensor name → a function of its dequantized array giving {HF name: array}."""
    parts = {v: k for k, v in _EXPERT_PARTS[arch].items()}
    moe = "block_sparse_moe" if arch == "mixtral" else "mlp"
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    mapping = {g: (lambda w, hf=hf: {hf: w}) for hf, g in _GLOBAL.items() if hf in state}
    for layer in range(config["num_hidden_layers"]):
        for rest, g in _LAYER.items():
            hf = f"model.layers.{layer}.{rest}"
            if hf not in state:
                continue
            proj = rest.split(".")[1] if rest.startswith("self_attn.") else None
            if arch == "mixtral" and proj in heads:
                mapping[f"blk.{layer}.{g}"] = (
                    lambda w, hf=hf, n=heads[proj]: {hf: _unpermute(w, n)})
            elif rest == "mlp.shared_expert_gate.weight":
                mapping[f"blk.{layer}.{g}"] = lambda w, hf=hf: {hf: w.reshape(1, -1)}
            else:
                mapping[f"blk.{layer}.{g}"] = lambda w, hf=hf: {hf: w}
        prefix = f"model.layers.{layer}.{moe}.experts"
        for part in ("gate", "up", "down"):
            mapping[f"blk.{layer}.ffn_{part}_exps.weight"] = (
                lambda w, prefix=prefix, p=parts[part]: {
                    f"{prefix}.{e}.{p}.weight": w[e] for e in range(w.shape[0])})
    return mapping


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
