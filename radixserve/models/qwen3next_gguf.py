"""A ``qwen3next`` GGUF file's tensors as transformers' ``Qwen3NextForCausalLM`` holds them,
and the row order the as-stored path (models/gguf_stored.py) gives each fused matrix.

What convert_hf_to_gguf.py (``Qwen3NextModel``) does to a tensor, and what this layout does:

==========================  ==================================  ===============================
transformers                file                                undone by
==========================  ==================================  ===============================
1 + w norms (input, post-   the multiplier 1 + w                ``to_hf``: minus 1 (Qwen35Gguf)
attention, q/k, final)
``A_log``                   ``ssm_a`` = -exp(A_log)             ``to_hf``: log(-A) (Qwen35Gguf)
``dt_bias``                 ``ssm_dt.bias``                     a name (Qwen35Gguf)
``conv1d.weight`` [C, 1, K] ``ssm_conv1d`` [C, K]               ``to_hf``: unsqueezed
``in_proj_qkvz`` (rows per  ``attn_qkv`` ([q | k | v]) and      loaded as the packed shards
key head [q_h|k_h|v_h|z_h]) ``attn_gate`` (z), two tensors;     ``in_proj_qkv``, ``in_proj_z``
                            files from before that change:      (rows as the model holds them);
                            ``ssm_in``, as transformers holds   ``ssm_in``: ``row_order``
                            it                                  (``qkvz_row_order``) as stored
``in_proj_ba`` (rows per    ``ssm_ba``, as transformers holds   ``row_order`` (``ba_row_order``)
key head [b_h | a_h])       it                                  as stored
==========================  ==================================  ===============================

Unlike ``qwen35`` files, the value heads keep transformers' grouped order (the converter's
``_LinearAttentionVReorderBase`` is Qwen3.5's only), so nothing else is reordered. The MoE
tensors are Qwen3-MoE's (models/moe.py), a dense layer's MLP ``ffn_{gate,up,down}``; the MTP
block (blocks from ``num_layers`` on) is skipped.

``to_hf`` gives transformers' values and row order (the model's ``load_weights`` reorders the
fused matrices itself); ``row_order`` gives the rows a stored matrix must take to be the
model's layer, which for the fused matrices is not transformers' order.
"""

from __future__ import annotations

import torch

from radixserve.model_config import LINEAR, ModelConfig
from radixserve.models.qwen3next import ba_row_order, qkvz_row_order
from radixserve.models.qwen35_gguf import Qwen35Gguf

_FUSED = {"ssm_in": "in_proj_qkvz", "ssm_ba": "in_proj_ba"}  # llama.cpp → transformers


class Qwen3NextGguf(Qwen35Gguf):
    """The GGUF → transformers mapping of a qwen3next file of shape ``config``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        la = config.linear_attn
        # value heads as transformers groups them: Qwen3.5's reorders are identities here
        self.is_tiled = False
        self.value_order = torch.arange(la.num_value_heads * la.value_head_dim)
        self.qkv_order = torch.arange(la.conv_dim)
        self.head_order = torch.arange(la.num_value_heads)
        self.fused_orders = {"in_proj_qkvz": qkvz_row_order(la), "in_proj_ba": ba_row_order(la)}

    def hf_name(self, gguf_name: str) -> str | None:
        """llama.cpp tensor name → transformers' (no ``model.`` prefix); None for the MTP
        block's unless it runs. ValueError for a tensor a Qwen3-Next decoder does not have."""
        parts = gguf_name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in _FUSED and parts[1].isdecimal():
            layer = int(parts[1])
            if layer >= self.num_layers:  # an MTP block is a full-attention layer
                raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in the MTP block of "
                                 "a qwen3next model")
            if self.layer_types[layer] != LINEAR:
                raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in full-attention "
                                 f"layer {layer} of a qwen3next model")
            return f"layers.{layer}.linear_attn.{_FUSED[parts[2]]}.{parts[3]}"
        return super().hf_name(gguf_name)

    def row_order(self, hf_name: str) -> torch.Tensor | None:
        """The rows of the stored matrix ``hf_name`` (``.weight`` or not) in the model's
        order (``model = stored[order]``); None where they are already."""
        return self.fused_orders.get(_fused_base(hf_name))

    def to_hf(self, hf_name: str, t: torch.Tensor) -> torch.Tensor:
        """A whole tensor as the file holds it (dequantized) → transformers' values, shape
        and order (the fused matrices: as stored)."""
        if _fused_base(hf_name) in self.fused_orders:
            return t
        return super().to_hf(hf_name, t)


def _fused_base(hf_name: str) -> str:
    """``layers.3.linear_attn.in_proj_ba.weight`` → ``in_proj_ba``."""
    return hf_name.removesuffix(".weight").rsplit(".", 1)[-1]
