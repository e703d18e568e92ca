"""LoRA adapters read from disk and checked against the base model: a PEFT folder
(``adapter_config.json`` + ``adapter_model.safetensors``) or a llama.cpp GGUF LoRA file
(``general.type = adapter``, ``adapter.type = lora``, tensors ``blk.N.<base>.weight.lora_a`` /
``.lora_b``).

A linear ``W`` with an adapter computes ``y = W x + scale * B (A x)``, ``A`` [r, in] and ``B``
[out, r]; PEFT's ``scale`` is ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA),
llama.cpp's ``alpha / r`` (1 without an alpha). The model fuses q/k/v and gate/up into one
linear each, so an adapter's parts for one fused linear are stacked: ``A`` [r_q + r_k + r_v, in]
and a block-diagonal ``B`` [q + k + v, r_q + r_k + r_v] with the scale folded in (a missing part
is zero rows). One ``(A, B)`` per (layer, fused linear) the adapter touches: `LoraAdapter`.

Every mismatch with the base — architecture, layer count, a matrix's shape, a rank that differs
between A, B and the config, an unsupported target or option — is a ValueError at load.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

from radixserve.model_config import ModelConfig

# the checkpoint's projection → (the model's fused linear, its part index)
TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0),
           "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", 0)}
_GGUF_TARGETS = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj",
                 "attn_output": "o_proj", "ffn_gate": "gate_proj", "ffn_up": "up_proj",
                 "ffn_down": "down_proj"}
_PERMUTED = ("LlamaForCausalLM", "MistralForCausalLM")  # llama.cpp permutes their Q/K rows
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")


@dataclass(frozen=True)
class LoraAdapter:
    """``layers[(layer index, fused linear name)] = (A, B)``: ``y += (x @ A.T) @ B.T``, the
    scale already in ``B``."""

    path: str
    rank: int
    layers: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def part_sizes(cfg: ModelConfig, linear: str) -> tuple[tuple[int, ...], int]:
    """(the output sizes of ``linear``'s parts, its input size)."""
    return {"qkv_proj": ((cfg.q_size, cfg.kv_size, cfg.kv_size), cfg.hidden_size),
            "o_proj": ((cfg.hidden_size,), cfg.q_size),
            "gate_up_proj": ((cfg.intermediate_size,) * 2, cfg.hidden_size),
            "down_proj": ((cfg.hidden_size,), cfg.intermediate_size)}[linear]


def load_lora(path: str, cfg: ModelConfig, device: torch.device,
              dtype: torch.dtype) -> LoraAdapter:
    """The adapter at ``path`` (a PEFT folder or a ``.gguf`` file) for a base of shape ``cfg``;
    FileNotFoundError / ValueError on a missing file or any mismatch."""
    if cfg.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"LoRA adapters are not supported for {cfg.architecture}; "
                         f"supported: {list(SUPPORTED_ARCHITECTURES)}")
    if os.path.isdir(path):
        parts, rank = _peft_parts(path, cfg)
    elif os.path.isfile(path) and path.endswith(".gguf"):
        parts, rank = _gguf_parts(path, cfg)
    else:
        raise FileNotFoundError(f"no LoRA adapter at {path!r} (a PEFT folder with "
                                "adapter_config.json, or a .gguf LoRA file)")
    if not parts:
        raise ValueError(f"the LoRA adapter at {path!r} has no q/k/v/o/gate/up/down matrices")
    layers = {}
    for (layer, linear), found in sorted(parts.items()):
        layers[(layer, linear)] = _stack(cfg, linear, found, device, dtype)
    return LoraAdapter(path, rank, layers)


def _stack(cfg: ModelConfig, linear: str, found: dict, device, dtype):
    """One fused linear's (A, B) from its parts {index: (A, B, scale)}."""
    outs, _ = part_sizes(cfg, linear)
    ranks = [found[i][0].shape[0] if i in found else 0 for i in range(len(outs))]
    a = torch.cat([found[i][0].float() for i in sorted(found)])
    b = torch.zeros(sum(outs), sum(ranks))
    for i, (lora_a, lora_b, scale) in found.items():
        row, col = sum(outs[:i]), sum(ranks[:i])
        b[row:row + outs[i], col:col + ranks[i]] = lora_b.float() * scale
    return a.to(device, dtype).contiguous(), b.to(device, dtype).contiguous()


def _check(cfg: ModelConfig, where: str, layer: int, proj: str, a: torch.Tensor,
           b: torch.Tensor, rank: int | None) -> None:
    if proj not in TARGETS:
        raise ValueError(f"{where}: LoRA on {proj!r} is not supported; supported targets: "
                         f"{sorted(TARGETS)}")
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(f"{where}: layer {layer} does not exist; the base model has "
                         f"{cfg.num_layers} layers")
    linear, idx = TARGETS[proj]
    outs, in_features = part_sizes(cfg, linear)
    r = a.shape[0]
    if (a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape[0] != outs[idx]
            or b.shape[1] != r):
        raise ValueError(f"{where}: layer {layer} {proj}: A {tuple(a.shape)} and B "
                         f"{tuple(b.shape)} do not fit the base model (A [r, {in_features}], "
                         f"B [{outs[idx]}, r]); is it an adapter for another base model?")
    if rank is not None and r != rank:
        raise ValueError(f"{where}: layer {layer} {proj} has rank {r}, the config says {rank}")


# -- PEFT folders ---------------------------------------------------------------------------

def _peft_parts(path: str, cfg: ModelConfig) -> tuple[dict, int]:
    from safetensors.torch import load_file

    config_path = os.path.join(path, "adapter_config.json")
    weights_path = os.path.join(path, "adapter_model.safetensors")
    for p in (config_path, weights_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p} is missing (a PEFT LoRA folder holds "
                                    "adapter_config.json and adapter_model.safetensors)")
    with open(config_path) as f:
        conf = json.load(f)
    if conf.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {conf.get('peft_type')!r} is not LORA")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if conf.get(key):
            raise ValueError(f"{path}: {key} is not supported")
    if conf.get("bias", "none") != "none":
        raise ValueError(f"{path}: LoRA biases (bias={conf['bias']!r}) are not supported")
    rank, alpha = int(conf["r"]), float(conf.get("lora_alpha", conf["r"]))
    scale = alpha / math.sqrt(rank) if conf.get("use_rslora") else alpha / rank
    tensors = load_file(weights_path)
    parts: dict = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            if ".lora_B." not in name:
                raise ValueError(f"{path}: unexpected tensor {name!r}")
            continue
        b = tensors.get(name.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise ValueError(f"{path}: {name!r} has no lora_B")
        module = name.split(".lora_A.")[0].split(".")
        if "layers" not in module:
            raise ValueError(f"{path}: LoRA on {'.'.join(module)!r} is not supported; "
                             f"supported targets: {sorted(TARGETS)}")
        layer, proj = int(module[module.index("layers") + 1]), module[-1]
        _check(cfg, path, layer, proj, a, b, rank)
        linear, idx = TARGETS[proj]
        parts.setdefault((layer, linear), {})[idx] = (a, b, scale)
    return parts, rank


# -- GGUF LoRA files (llama.cpp's convert_lora_to_gguf.py) -----------------------------------

def _gguf_parts(path: str, cfg: ModelConfig) -> tuple[dict, int]:
    from gguf import GGUFReader

    from radixserve.layers.gguf_quant import dequantize
    from radixserve.models.loader import unpermute_rows
    from radixserve.models.registry import GGUF_ARCHITECTURES

    reader = GGUFReader(path)

    def field(key: str, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    if field("general.type") != "adapter" or field("adapter.type") != "lora":
        raise ValueError(f"{path} is not a GGUF LoRA adapter (general.type "
                         f"{field('general.type')!r}, adapter.type {field('adapter.type')!r})")
    arch = field("general.architecture")
    if GGUF_ARCHITECTURES.get(arch) != cfg.architecture:
        raise ValueError(f"{path} is an adapter for a {arch!r} model; the base model is "
                         f"{cfg.architecture}")
    alpha = float(field("adapter.lora.alpha", 0.0))
    tensors = {t.name: t for t in reader.tensors}
    parts: dict = {}
    rank = None
    for name, t in tensors.items():
        if not name.endswith(".lora_a"):
            if not name.endswith(".lora_b"):
                raise ValueError(f"{path}: unexpected tensor {name!r}")
            continue
        other = tensors.get(name[:-1] + "b")
        if other is None:
            raise ValueError(f"{path}: {name!r} has no lora_b")
        a, b = (dequantize(x.data, x.tensor_type, tuple(int(d) for d in reversed(x.shape)))
                for x in (t, other))
        pieces = name.split(".")  # blk.N.attn_q.weight.lora_a
        if pieces[0] != "blk" or pieces[2] not in _GGUF_TARGETS:
            raise ValueError(f"{path}: LoRA on {name!r} is not supported; supported: "
                             f"{sorted(_GGUF_TARGETS)}")
        layer, proj = int(pieces[1]), _GGUF_TARGETS[pieces[2]]
        _check(cfg, path, layer, proj, a, b, rank)
        rank = a.shape[0]
        if cfg.architecture in _PERMUTED and proj in ("q_proj", "k_proj"):
            heads = cfg.num_heads if proj == "q_proj" else cfg.num_kv_heads
            b = b[unpermute_rows(b.shape[0], heads)]  # llama.cpp's row order → HF's, as the base
        scale = alpha / rank if alpha else 1.0
        linear, idx = TARGETS[proj]
        parts.setdefault((layer, linear), {})[idx] = (a, b, scale)
    return parts, rank or 0
