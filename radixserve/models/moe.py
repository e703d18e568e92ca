"""Mixture-of-experts decoders: Qwen2-MoE (``Qwen2MoeForCausalLM``, GGUF ``qwen2moe``: a
shared expert beside the routed ones, q/k/v bias), Qwen3-MoE (``Qwen3MoeForCausalLM``, GGUF
``qwen3moe``) and Mixtral (``MixtralForCausalLM``, GGUF ``llama`` with
``llama.expert_count > 0``).

The model is the Llama-family decoder (models/llama.py) whose MLPs are sparse MoE blocks
(layers/moe.py) where ``ModelConfig.moe`` says so. This file holds what differs at the edges:
the MoE shape from config.json or GGUF metadata, Mixtral's checkpoint names, and the GGUF 3-D
expert tensors (``blk.N.ffn_{gate,up,down}_exps`` [n_expert, rows, cols]) cut into one matrix
per expert, each a view of the file's bytes (no copy).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.model_config import MoeConfig
from radixserve.models.llama import LlamaForCausalLM

EXPERT = "*"  # the expert index in the HF name of a GGUF 3-D expert tensor
GGUF_EXPERT_NAMES = {"ffn_gate_exps": f"mlp.experts.{EXPERT}.gate_proj",
                     "ffn_up_exps": f"mlp.experts.{EXPERT}.up_proj",
                     # convert_hf_to_gguf.py --fuse-gate-up-exps: [gate | up] rows per expert
                     "ffn_gate_up_exps": f"mlp.experts.{EXPERT}.gate_up_proj",
                     "ffn_down_exps": f"mlp.experts.{EXPERT}.down_proj",
                     "ffn_gate_inp": "mlp.gate",
                     "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                     "ffn_up_shexp": "mlp.shared_expert.up_proj",
                     "ffn_down_shexp": "mlp.shared_expert.down_proj",
                     "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}  # [hidden]: one output
# Mixtral's checkpoint names → the Qwen3-MoE-style names the model uses
_MIXTRAL_NAMES = ((re.compile(r"\.block_sparse_moe\."), ".mlp."),
                  (re.compile(r"(\.experts\.\d+)\.w1\."), r"\1.gate_proj."),
                  (re.compile(r"(\.experts\.\d+)\.w2\."), r"\1.down_proj."),
                  (re.compile(r"(\.experts\.\d+)\.w3\."), r"\1.up_proj."))


class MoeForCausalLM(LlamaForCausalLM):
    """The Llama-family decoder with sparse MoE blocks (``config.moe``); loads Qwen2-MoE,
    Qwen3-MoE and Mixtral checkpoints (per-expert ``experts.E.{gate,up,down}_proj`` /
    ``w1, w3, w2``; Qwen2-MoE's ``shared_expert.*`` and ``shared_expert_gate``)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights((mixtral_to_moe_name(name), t) for name, t in weights)


def mixtral_to_moe_name(name: str) -> str:
    for pattern, replacement in _MIXTRAL_NAMES:
        name = pattern.sub(replacement, name)
    return name


# -- the MoE shape -----------------------------------------------------------------------------

def moe_from_hf(arch: str, cfg: dict, num_layers: int) -> MoeConfig | None:
    """The MoeConfig of a config.json (None for the dense architectures)."""
    if arch == "MixtralForCausalLM":
        return MoeConfig(cfg["num_local_experts"], cfg["num_experts_per_tok"],
                         cfg["intermediate_size"], norm_topk_prob=True)
    if arch not in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        return None
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    step, only = cfg.get("decoder_sparse_step", 1) or 1, set(cfg.get("mlp_only_layers") or ())
    dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
    shared = (cfg.get("shared_expert_intermediate_size") or 0
              if arch == "Qwen2MoeForCausalLM" else 0)
    return MoeConfig(num_experts, cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
                     norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                     dense_layers=dense, shared_expert_size=shared)


def moe_from_gguf(field, arch: str, tensor_names: set[str], num_layers: int
                  ) -> MoeConfig | None:
    """The MoeConfig of a GGUF file (``field(key, default)`` reads its metadata), None when
    ``{arch}.expert_count`` is absent or 0. A layer is sparse where it has a router."""
    num_experts = field(f"{arch}.expert_count", 0)
    if not num_experts:
        return None
    if "blk.0.ffn_gate.0.weight" in tensor_names:
        raise ValueError("GGUF experts stored one tensor per expert (blk.N.ffn_gate.E, files "
                         "converted before llama.cpp merged them) are not supported; "
                         "supported: the 3-D blk.N.ffn_{gate,up,down}_exps tensors")
    dense = tuple(i for i in range(num_layers)
                  if f"blk.{i}.ffn_gate_inp.weight" not in tensor_names)
    width = field(f"{arch}.expert_feed_forward_length") or field(f"{arch}.feed_forward_length")
    shared = 0
    if any(name.endswith(".ffn_up_shexp.weight") for name in tensor_names):
        shared = (field(f"{arch}.expert_shared_feed_forward_length")
                  or field(f"{arch}.feed_forward_length"))  # llama.cpp's default: n_ff
    # llama.cpp renormalizes the top-k weights of Qwen3-MoE and Mixtral (qwen3moe.cpp,
    # llama.cpp), not Qwen2-MoE's (qwen2moe.cpp), unless the file says otherwise
    return MoeConfig(num_experts, field(f"{arch}.expert_used_count"), width,
                     norm_topk_prob=bool(field(f"{arch}.expert_weights_norm",
                                               arch != "qwen2moe")),
                     dense_layers=dense, shared_expert_size=shared)


# -- GGUF 3-D expert tensors ---------------------------------------------------------------------

@dataclass(frozen=True)
class ExpertSlice:
    """One expert's matrix of a GGUF 3-D expert tensor, with the fields of a
    ``gguf.ReaderTensor`` the loaders read: ``shape`` in GGUF order (cols, rows), ``data`` a
    view of the file's mapping, ``data_offset`` / ``n_bytes`` its bytes in the data section."""

    name: str
    tensor_type: object
    shape: np.ndarray
    data: np.ndarray
    data_offset: int
    n_bytes: int


def expert_slices(tensor) -> list[ExpertSlice]:
    """A GGUF 3-D expert tensor [n_expert, rows, cols] → its experts' matrices, in order (a
    2-D one [n_expert, rows], gpt-oss's expert biases: their vectors)."""
    num_experts = int(tensor.shape[-1])
    per_expert = int(tensor.n_bytes) // num_experts
    return [ExpertSlice(f"{tensor.name}#{e}", tensor.tensor_type, tensor.shape[:-1],
                        tensor.data[e], int(tensor.data_offset) + e * per_expert, per_expert)
            for e in range(num_experts)]


def expand_experts(name: str | None, tensor) -> Iterator[tuple[str, object]]:
    """(HF name, tensor) pairs of one GGUF tensor: itself, or one per expert for a 3-D expert
    tensor (``name`` holds ``EXPERT`` where the index goes)."""
    if name is None:
        return
    if EXPERT not in name:
        yield name, tensor
        return
    for e, part in enumerate(expert_slices(tensor)):
        yield name.replace(EXPERT, str(e)), part


# transformers 5's fused experts (the Qwen3.5-MoE releases' checkpoints store them so, with no
# ``.weight`` suffix): gate_up_proj [n_expert, 2 * width, hidden] (gate rows, then up rows),
# down_proj [n_expert, hidden, width]
HF_FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def fused_expert_parts(name: str, shape) -> list[tuple[str, tuple]] | None:
    """For a checkpoint's fused 3-D expert tensor of ``shape``: (the per-expert name, as
    Qwen3-MoE checkpoints have it, the index of that matrix in the tensor) for each expert's
    gate, up and down matrices; None for any other tensor."""
    if not name.endswith(HF_FUSED_EXPERTS):
        return None
    prefix, kind = name.rsplit(".", 1)
    num_experts, rows = int(shape[0]), int(shape[1])
    if kind == "down_proj":
        return [(f"{prefix}.{e}.down_proj.weight", (e,)) for e in range(num_experts)]
    halves = (("gate_proj", slice(0, rows // 2)), ("up_proj", slice(rows // 2, rows)))
    return [(f"{prefix}.{e}.{part}.weight", (e, rows_of)) for e in range(num_experts)
            for part, rows_of in halves]


def unfuse_hf_experts(weights: Iterable[tuple[str, torch.Tensor]]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint (name, tensor) pairs with each fused 3-D expert tensor cut into its experts'
    matrices (``fused_expert_parts``); the other tensors as they are."""
    for name, weight in weights:
        parts = fused_expert_parts(name, weight.shape)
        if parts is None:
            yield name, weight
        else:
            yield from ((part, weight[index]) for part, index in parts)


def split_expert_weights(name: str, weight: torch.Tensor
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """A dequantized tensor [n_expert, rows, cols] → one (HF name, matrix) per expert (the
    shared expert's gate, stored [hidden], as the matrix [1, hidden] it is)."""
    if EXPERT not in name:
        yield name, (weight.reshape(1, -1) if name.endswith("shared_expert_gate.weight")
                     else weight)
        return
    for e in range(weight.shape[0]):
        yield name.replace(EXPERT, str(e)), weight[e]
