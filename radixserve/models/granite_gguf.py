"""A ``granite`` / ``granitemoe`` / ``granitehybrid`` GGUF file's tensors as the Granite model
(models/granite.py) takes them: llama.cpp's names mapped to transformers' (less ``model.``,
with granite_config.py's renames) and every change its converter made undone.

What convert_hf_to_gguf.py (``GraniteModel``, ``GraniteMoeModel``, ``GraniteHybridModel`` over
``LlamaModel`` and ``Mamba2Model``) does to a tensor, and so what ``to_hf`` undoes:

- q_proj / k_proj rows permuted per head (``LlamaModel.permute``: rotate-half pairs
  interleaved), in the hybrid too, whose attention has no RoPE;
- the MoE's fused ``input_linear`` [E, 2 * width, hidden] cut into ``ffn_gate_exps`` and
  ``ffn_up_exps`` (moe.py cuts them per expert), the router ``ffn_gate_inp``; the shared MLP's
  ``input_linear`` cut into gate and up: ``ffn_{gate,up,down}_shexp`` beside experts, else the
  plain ``ffn_{gate,up,down}`` (a dense Granite 4.0-H model);
- Mamba2: ``A_log`` stored as A = -exp(A_log) and ``D`` as [H, 1] (``ssm_a``, ``ssm_d``, no
  ``.weight`` suffix), ``dt_bias`` as ``ssm_dt.bias``, ``conv1d.weight`` [C, 1, K] squeezed to
  [C, K], the gated norm's weight [inner] as [groups, inner / groups].

Norms and the other matrices are stored as they are. The as-stored path (models/gguf_stored.py)
takes q_proj's and k_proj's stored rows in ``row_order`` and the float tensors through
``to_hf``; no matrix's input columns moved (``wrap`` is the identity).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from radixserve.layers.gguf_quant import dequantize
from radixserve.model_config import ModelConfig
from radixserve.models.moe import GGUF_EXPERT_NAMES, split_expert_weights

_LAYER = {  # llama.cpp name → the model's, in every decoder layer
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate_shexp": "shared_mlp.gate_proj",
    "ffn_up_shexp": "shared_mlp.up_proj", "ffn_down_shexp": "shared_mlp.down_proj",
    "ssm_in": "mamba.in_proj", "ssm_conv1d": "mamba.conv1d", "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
    **{k: v for k, v in GGUF_EXPERT_NAMES.items() if "shexp" not in k},
}
_MAMBA_PARAMS = {("ssm_a", ""): "mamba.A_log", ("ssm_d", ""): "mamba.D",
                 ("ssm_dt", "bias"): "mamba.dt_bias"}
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def unpermute_order(rows: int, num_heads: int) -> torch.Tensor:
    """The index that undoes llama.cpp's Q/K permutation: ``hf = stored[order]`` (stored row
    ``h * d + 2 i + j`` holds transformers' ``h * d + j * d / 2 + i``)."""
    pairs = torch.arange(rows).reshape(num_heads, rows // num_heads // 2, 2)
    return pairs.transpose(1, 2).reshape(-1)


class GraniteGguf:
    """The GGUF → model mapping of a Granite file of shape ``config``."""

    def __init__(self, config: ModelConfig) -> None:
        self.num_layers = config.num_layers
        self.q_rows = (config.num_heads * config.head_dim, config.num_heads)
        self.k_rows = (config.num_kv_heads * config.head_dim, config.num_kv_heads)
        # the plain ffn_* tensors: a dense Granite's MLP, or a dense hybrid's shared MLP
        shared = config.granite is not None and config.granite.shared_intermediate_size > 0
        mlp = "shared_mlp" if shared and config.moe is None else "mlp"
        self.names = dict(_LAYER, ffn_gate=f"{mlp}.gate_proj", ffn_up=f"{mlp}.up_proj",
                          ffn_down=f"{mlp}.down_proj")

    def hf_name(self, gguf_name: str) -> str | None:
        """llama.cpp tensor name → the model's (no ``model.`` prefix); None for rope_freqs
        (read with the config). ValueError for a tensor a Granite decoder does not have (q/k/v
        stored fused among them)."""
        parts = gguf_name.split(".")
        if gguf_name == "rope_freqs.weight":  # llama3 rope scaling: in the config
            return None
        if parts[0] in _TOP and len(parts) == 2:
            return f"{_TOP[parts[0]]}.{parts[1]}"
        if (parts[0] != "blk" or len(parts) < 3 or not parts[1].isdecimal()
                or int(parts[1]) >= self.num_layers):
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a Granite model")
        layer, base, suffix = parts[1], parts[2], ".".join(parts[3:])
        if (base, suffix) in _MAMBA_PARAMS:
            return f"layers.{layer}.{_MAMBA_PARAMS[base, suffix]}"
        if base == "attn_qkv":
            raise ValueError(f"{gguf_name}: q/k/v stored fused (convert_hf_to_gguf.py "
                             "--fuse-qkv) is not supported for Granite; convert without it")
        if base not in self.names or not suffix:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a Granite model")
        return f"layers.{layer}.{self.names[base]}.{suffix}"

    def row_order(self, hf_name: str) -> torch.Tensor | None:
        """The rows of the stored matrix ``hf_name`` (``.weight`` or not) in transformers'
        order (``hf = stored[order]``): q_proj's and k_proj's unpermuted; None for the rest."""
        base = hf_name.removesuffix(".weight")
        if base.endswith("self_attn.q_proj"):
            return unpermute_order(*self.q_rows)
        if base.endswith("self_attn.k_proj"):
            return unpermute_order(*self.k_rows)
        return None

    def wrap(self, hf_name: str, layer: nn.Module) -> nn.Module:
        """``layer`` as is: no stored matrix has its input columns moved."""
        return layer

    def to_hf(self, hf_name: str, t: torch.Tensor) -> torch.Tensor:
        """A whole tensor as the file holds it (dequantized, HF's row-major shape) → the
        model's values, shape and order."""
        if hf_name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            return t[self.row_order(hf_name)]
        if hf_name.endswith("mamba.A_log"):
            return torch.log(-t.reshape(-1))  # stored: A = -exp(A_log), [H, 1]
        if hf_name.endswith(("mamba.D", "mamba.norm.weight")):
            return t.reshape(-1)  # [H, 1]; [groups, inner / groups]
        if hf_name.endswith("mamba.conv1d.weight"):
            return t.unsqueeze(1)  # [C, K] → [C, 1, K]
        return t

    def weights(self, reader) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the file, model-named and -valued (float32; a 3-D expert tensor as
        one matrix per expert)."""
        for tensor in reader.tensors:
            name = self.hf_name(tensor.name)
            if name is None:
                continue
            shape = tuple(int(d) for d in reversed(tensor.shape))
            yield from split_expert_weights(
                name, self.to_hf(name, dequantize(tensor.data, tensor.tensor_type, shape)))
