"""A ``qwen35`` / ``qwen35moe`` GGUF file's tensors as transformers holds them: llama.cpp's
names mapped to ``Qwen3_5ForCausalLM``'s (no ``model.`` prefix) and every change its converter
made undone.

What convert_hf_to_gguf.py (``Qwen3_5TextModel``: ``_LinearAttentionVReorderBase`` over
``Qwen3NextModel``) does to a tensor, and so what ``to_hf`` undoes:

- the 1 + w RMS norms (``input_layernorm``, ``post_attention_layernorm``, ``norm``, q/k norms)
  are stored as the multiplier 1 + w (not the DeltaNet's gated ``linear_attn.norm``, which
  multiplies by w);
- ``A_log`` is stored as A = -exp(A_log) (``ssm_a``, no ``.weight`` suffix), ``dt_bias`` as
  ``ssm_dt.bias``, the depthwise ``conv1d.weight`` [C, 1, K] squeezed to [C, K];
- where value heads outnumber key heads, the value heads are reordered from grouped by key
  head (transformers: value head j reads key head j // r) to tiled (llama.cpp: j % n_k), along
  the V rows of ``in_proj_qkv``, the rows of ``in_proj_z``, ``in_proj_a``, ``in_proj_b``, the
  V channels of ``conv1d``, ``A_log``, ``dt_bias`` and the input columns of ``out_proj``.

q_proj (query and gate interleaved per head) and the other matrices are stored as they are; a
``qwen35moe`` file's experts as Qwen3-MoE's are (models/moe.py: ``blk.N.ffn_{gate,up,down}_exps``
[n_expert, rows, cols] cut per expert, the router ``ffn_gate_inp``, the shared expert and its
gate ``ffn_*_shexp``).
The MTP block a file may carry (blocks from ``num_layers`` on) is skipped.

The as-stored path (models/gguf_stored.py) keeps matrices in the file's blocks: it takes the
rows of a matrix in ``row_order``, runs ``out_proj`` on inputs put in the file's column order
(``wrap``), and the float tensors through ``to_hf``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from radixserve.layers.gguf_quant import dequantize
from radixserve.model_config import LINEAR, ModelConfig
from radixserve.models.moe import GGUF_EXPERT_NAMES, split_expert_weights

_LAYER = {  # llama.cpp name → transformers' in a decoder layer
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", **GGUF_EXPERT_NAMES,
}
_LINEAR_LAYER = {  # ... in a Gated DeltaNet layer
    "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
}
_LINEAR_PARAMS = {("ssm_a", ""): "linear_attn.A_log", ("ssm_dt", "bias"): "linear_attn.dt_bias"}
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_ONE_PLUS_W = ("input_layernorm.weight", "post_attention_layernorm.weight",
               "q_norm.weight", "k_norm.weight", "pre_fc_norm_embedding.weight",
               "pre_fc_norm_hidden.weight")
# an MTP block's own tensors (llama.cpp's nextn names) → transformers' under ``mtp.``
_NEXTN = {"eh_proj": "fc", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden",
          "shared_head_norm": "norm"}


def untile_order(num_k: int, num_v: int, head_dim: int) -> torch.Tensor:
    """The index that puts llama.cpp's tiled value heads back in transformers' grouped order:
    ``hf = gguf[order]`` along the value axis (``num_v * head_dim`` long). Grouped position
    (k, r, d) holds tiled position (r, k, d), r < num_v / num_k."""
    tiled = torch.arange(num_v * head_dim).reshape(num_v // num_k, num_k, head_dim)
    return tiled.transpose(0, 1).reshape(-1)


class Qwen35Gguf:
    """The GGUF → transformers mapping of a qwen35 file of shape ``config``."""

    def __init__(self, config: ModelConfig) -> None:
        la = config.linear_attn
        if la is None:
            raise ValueError("a qwen35 model needs its linear-attention shape")
        self.num_layers = config.num_layers
        self.num_mtp_layers = config.num_mtp_layers
        self.layer_types = la.layer_types
        qk = 2 * la.num_key_heads * la.key_head_dim
        values = untile_order(la.num_key_heads, la.num_value_heads, la.value_head_dim)
        self.value_order = values  # value channels: in_proj_z rows, out_proj columns
        self.qkv_order = torch.cat([torch.arange(qk), qk + values])  # q, k as stored; v
        self.head_order = untile_order(la.num_key_heads, la.num_value_heads, 1)
        self.is_tiled = la.num_value_heads != la.num_key_heads  # else the orders are identities

    def hf_name(self, gguf_name: str) -> str | None:
        """llama.cpp tensor name → transformers' (no ``model.`` prefix); None for the MTP
        block's. ValueError for a tensor a Qwen3.5 decoder does not have."""
        parts = gguf_name.split(".")
        if parts[0] in _TOP and len(parts) == 2:
            return f"{_TOP[parts[0]]}.{parts[1]}"
        if parts[0] != "blk" or len(parts) < 3 or not parts[1].isdecimal():
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a qwen35 model")
        layer, base, suffix = int(parts[1]), parts[2], ".".join(parts[3:])
        if layer >= self.num_layers:  # the MTP block (nextn): loaded only when it runs
            return self._mtp_name(layer - self.num_layers, base, suffix, gguf_name)
        is_linear = self.layer_types[layer] == LINEAR
        if is_linear and (base, suffix) in _LINEAR_PARAMS:
            return f"layers.{layer}.{_LINEAR_PARAMS[base, suffix]}"
        if base == "attn_qkv" and not is_linear:
            raise ValueError(f"{gguf_name}: q/k/v fused in a full-attention layer "
                             "(convert_hf_to_gguf.py --fuse-qkv) is not supported; "
                             "convert without it")
        name = (_LINEAR_LAYER.get(base) if is_linear else None) or _LAYER.get(base)
        if name is None or not suffix:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a qwen35 model "
                             f"(layer {layer}: {self.layer_types[layer]})")
        return f"layers.{layer}.{name}.{suffix}"

    def _mtp_name(self, index: int, base: str, suffix: str, gguf_name: str) -> str | None:
        """An MTP block tensor's name (``blk.N.nextn.*`` and the layer's own, N from the
        decoder's block count on), None when the block does not run."""
        if index >= self.num_mtp_layers:
            return None
        if base == "nextn":
            part, _, rest = suffix.partition(".")
            if part in _NEXTN:
                return f"mtp.{_NEXTN[part]}.{rest}"
        elif base in _LAYER and suffix:
            return f"mtp.layers.{index}.{_LAYER[base]}.{suffix}"
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in a qwen35 MTP block")

    def row_order(self, hf_name: str) -> torch.Tensor | None:
        """The rows of the stored matrix ``hf_name`` (``.weight`` or not) in transformers'
        order (``hf = stored[order]``); None where they are already."""
        if not self.is_tiled:
            return None
        base = hf_name.removesuffix(".weight")
        if base.endswith("linear_attn.in_proj_qkv"):
            return self.qkv_order
        if base.endswith("linear_attn.in_proj_z"):
            return self.value_order
        if base.endswith(("linear_attn.in_proj_a", "linear_attn.in_proj_b")):
            return self.head_order
        return None

    def input_order(self, hf_name: str) -> torch.Tensor | None:
        """For ``out_proj``, whose input columns the file holds in tiled order: the index that
        takes transformers' input to the file's column order (``x_file = x[..., order]``)."""
        if self.is_tiled and hf_name.removesuffix(".weight").endswith("linear_attn.out_proj"):
            return torch.argsort(self.value_order)
        return None

    def wrap(self, hf_name: str, layer: nn.Module) -> nn.Module:
        """``layer`` built from the stored matrix ``hf_name``, taking transformers' input."""
        order = self.input_order(hf_name)
        return layer if order is None else InputPermuted(layer, order)

    def to_hf(self, hf_name: str, t: torch.Tensor) -> torch.Tensor:
        """A whole tensor as the file holds it (dequantized, [rows, cols] in HF's row-major
        shape) → transformers' values, shape and order."""
        order = self.row_order(hf_name)
        if order is not None:
            return t[order]
        if hf_name.endswith("linear_attn.out_proj.weight"):
            return t[:, self.value_order]
        if hf_name.endswith("linear_attn.A_log"):
            return torch.log(-t)[self.head_order]  # stored: A = -exp(A_log)
        if hf_name.endswith("linear_attn.dt_bias"):
            return t[self.head_order]
        if hf_name.endswith("linear_attn.conv1d.weight"):
            return t[self.qkv_order].unsqueeze(1)  # [C, K] → [C, 1, K]
        if hf_name.endswith(_ONE_PLUS_W) or hf_name in ("norm.weight", "mtp.norm.weight"):
            return t - 1.0  # stored: 1 + w
        return t

    def weights(self, reader) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the file the decoder runs, transformers-named and -valued (float32;
        a 3-D expert tensor as one matrix per expert)."""
        for tensor in reader.tensors:
            name = self.hf_name(tensor.name)
            if name is None:
                continue
            shape = tuple(int(d) for d in reversed(tensor.shape))
            yield from split_expert_weights(
                name, self.to_hf(name, dequantize(tensor.data, tensor.tensor_type, shape)))


class InputPermuted(nn.Module):
    """``inner`` (a stored ``out_proj``) on its input's channels put in the file's order."""

    def __init__(self, inner: nn.Module, order: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("order", order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.index_select(-1, self.order))
