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

Every mismatch with the base — architecture, layer count, a matrix's shape or type, a rank
that differs between A, B and the config, an unsupported target or option, a file that is not
an adapter — is a ValueError (`LoraFormatError`) at load, found by models/lora_check.py's
checks (the API process's too) before a weight is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from radixserve.model_config import ModelConfig
from radixserve.models.lora_check import (PEFT_WEIGHTS, TARGETS, check_lora_adapter, gguf_key,
                                          part_sizes, peft_key, read_peft_config)

_PERMUTED = ("LlamaForCausalLM", "MistralForCausalLM")  # llama.cpp permutes their Q/K rows


@dataclass(frozen=True)
class LoraAdapter:
    """``layers[(layer index, fused linear name)] = (A, B)``: ``y += (x @ A.T) @ B.T``, the
    scale already in ``B``."""

    path: str
    rank: int
    layers: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def load_lora(path: str, cfg: ModelConfig, device: torch.device,
              dtype: torch.dtype) -> LoraAdapter:
    """The adapter at ``path`` (a PEFT folder or a ``.gguf`` file) for a base of shape ``cfg``;
    FileNotFoundError / ValueError on a missing file or any mismatch."""
    check_lora_adapter(path, cfg)
    parts, rank = _peft_parts(path) if os.path.isdir(path) else _gguf_parts(path, cfg)
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


# -- PEFT folders ---------------------------------------------------------------------------

def _peft_parts(path: str) -> tuple[dict, int]:
    """{(layer, fused linear): {part: (A, B, scale)}} and the rank of a checked folder."""
    from safetensors.torch import load_file

    options = read_peft_config(path)
    tensors = load_file(os.path.join(path, PEFT_WEIGHTS))
    parts: dict = {}
    for name, a in tensors.items():
        layer, proj, which = peft_key(name)
        if which == "A":
            linear, idx = TARGETS[proj]
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            parts.setdefault((layer, linear), {})[idx] = (a, b, options.scale)
    return parts, options.rank


# -- GGUF LoRA files (llama.cpp's convert_lora_to_gguf.py) -----------------------------------

def _gguf_parts(path: str, cfg: ModelConfig) -> tuple[dict, int]:
    """As `_peft_parts`, for a checked GGUF LoRA file."""
    from radixserve.gguf_reader import open_gguf
    from radixserve.layers.gguf_quant import dequantize
    from radixserve.models.loader import unpermute_rows

    reader = open_gguf(path)
    alpha = reader.fields.get("adapter.lora.alpha")
    alpha = 0.0 if alpha is None else float(alpha.contents())
    tensors = {t.name: t for t in reader.tensors}
    parts: dict = {}
    rank = 0
    for name, t in tensors.items():
        layer, proj, which = gguf_key(name)
        if which != "a":
            continue
        a, b = (dequantize(x.data, x.tensor_type, tuple(int(d) for d in reversed(x.shape)))
                for x in (t, tensors[name[:-1] + "b"]))
        rank = a.shape[0]
        if cfg.architecture in _PERMUTED and proj in ("q_proj", "k_proj"):
            heads = cfg.num_heads if proj == "q_proj" else cfg.num_kv_heads
            b = b[unpermute_rows(b.shape[0], heads)]  # llama.cpp's row order → HF's, as the base
        scale = alpha / rank if alpha else 1.0
        linear, idx = TARGETS[proj]
        parts.setdefault((layer, linear), {})[idx] = (a, b, scale)
    return parts, rank
