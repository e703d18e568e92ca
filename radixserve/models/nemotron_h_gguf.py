"""A ``nemotron_h`` / ``nemotron_h_moe`` GGUF file's tensors as the model (models/nemotron_h.py)
holds them: llama.cpp's names mapped to the model's (transformers' ``NemotronHForCausalLM``
ones as models/nemotron_h_config.py's ``nemotron_h_hf_name`` gives them) and every change its
converter made undone.

What convert_hf_to_gguf.py (``NemotronHModel`` over ``GraniteHybridModel`` and ``Mamba2Model``)
does to a tensor, and so what ``to_hf`` undoes:

- ``A_log`` is stored as A = -exp(A_log), shaped [heads, 1] (``ssm_a``, no ``.weight``
  suffix); ``D`` as [heads, 1] (``ssm_d``); ``dt_bias`` as ``ssm_dt.bias``;
- the depthwise ``conv1d.weight`` [C, 1, K] is squeezed to [C, K];
- the gated norm's weight [inner] is shaped [n_groups, inner / n_groups] (``ssm_norm``);
- the attention layers' q and k rows are permuted within each head as for Llama (llama.cpp's
  rope layout, although these layers have no rope): undone by ``row_order``;
- a MoE file's experts are stacked [n_expert, rows, cols] (``ffn_{up,down}_exps``, cut per
  expert at load: models/moe.py), the router's ``e_score_correction_bias`` is
  ``exp_probs_b.bias``, the shared expert ``ffn_{up,down}_shexp``.

The MTP block a MoE file may carry (blocks from ``num_layers`` on) is skipped. The as-stored
path (models/gguf_stored.py) keeps matrices in the file's blocks: it takes q and k rows in
``row_order`` and the float tensors through ``to_hf``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from radixserve.layers.gguf_quant import dequantize
from radixserve.model_config import ModelConfig
from radixserve.models.moe import EXPERT, split_expert_weights

_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_LAYER = {  # llama.cpp name → the model's in a block
    "attn_norm": "norm",
    "ssm_in": "mixer.in_proj", "ssm_conv1d": "mixer.conv1d", "ssm_norm": "mixer.norm",
    "ssm_out": "mixer.out_proj",
    "attn_q": "mixer.q_proj", "attn_k": "mixer.k_proj", "attn_v": "mixer.v_proj",
    "attn_output": "mixer.o_proj",
    "ffn_up": "mixer.up_proj", "ffn_down": "mixer.down_proj",
    "ffn_gate_inp": "mixer.gate", "ffn_up_exps": f"mixer.experts.{EXPERT}.up_proj",
    "ffn_down_exps": f"mixer.experts.{EXPERT}.down_proj",
    "ffn_up_shexp": "mixer.shared_expert.up_proj",
    "ffn_down_shexp": "mixer.shared_expert.down_proj",
}
_PARAMS = {("ssm_a", ""): "mixer.A_log", ("ssm_d", ""): "mixer.D",
           ("ssm_dt", "bias"): "mixer.dt_bias",
           ("exp_probs_b", "bias"): "mixer.expert_bias"}


def qk_row_order(rows: int, num_heads: int) -> torch.Tensor:
    """The row index that undoes llama.cpp's q/k permutation (``hf = stored[order]``): within
    each head, HF row j * (head_dim / 2) + i is stored row 2i + j (j < 2)."""
    return torch.arange(rows).reshape(num_heads, rows // num_heads // 2, 2).transpose(1, 2) \
        .reshape(-1)


class NemotronHGguf:
    """The GGUF → model mapping of a nemotron_h file of shape ``config``."""

    def __init__(self, config: ModelConfig) -> None:
        self.num_layers = config.num_layers
        self.q_order = qk_row_order(config.q_size, config.num_heads)
        self.k_order = qk_row_order(config.kv_size, config.num_kv_heads)

    def hf_name(self, gguf_name: str) -> str | None:
        """llama.cpp tensor name → the model's; None for the MTP block's. ValueError for a
        tensor a Nemotron-H decoder does not have."""
        parts = gguf_name.split(".")
        if parts[0] in _TOP and len(parts) == 2:
            return f"{_TOP[parts[0]]}.{parts[1]}"
        if parts[0] != "blk" or len(parts) < 3 or not parts[1].isdecimal():
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a nemotron_h model")
        layer, base, suffix = int(parts[1]), parts[2], ".".join(parts[3:])
        if layer >= self.num_layers:  # the MTP block (nextn), not run here
            return None
        if (base, suffix) in _PARAMS:
            return f"layers.{layer}.{_PARAMS[base, suffix]}"
        if base not in _LAYER or not suffix:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a nemotron_h model")
        return f"layers.{layer}.{_LAYER[base]}.{suffix}"

    def row_order(self, hf_name: str) -> torch.Tensor | None:
        """The rows of the stored matrix ``hf_name`` (``.weight`` or not) in transformers'
        order (``hf = stored[order]``); None where they are already."""
        base = hf_name.removesuffix(".weight")
        if base.endswith("mixer.q_proj"):
            return self.q_order
        if base.endswith("mixer.k_proj"):
            return self.k_order
        return None

    def wrap(self, hf_name: str, layer: nn.Module) -> nn.Module:
        """No matrix takes its input in another order than transformers'."""
        return layer

    def to_hf(self, hf_name: str, t: torch.Tensor) -> torch.Tensor:
        """A whole tensor as the file holds it (dequantized, HF's row-major shape) →
        transformers' values and shape."""
        order = self.row_order(hf_name)
        if order is not None:
            return t[order]
        if hf_name.endswith("mixer.A_log"):
            return torch.log(-t).reshape(-1)  # stored: A = -exp(A_log), [heads, 1]
        if hf_name.endswith(("mixer.D", "mixer.norm.weight")):
            return t.reshape(-1)  # [heads, 1]; the norm [groups, inner / groups]
        if hf_name.endswith("mixer.conv1d.weight"):
            return t.unsqueeze(1)  # [C, K] → [C, 1, K]
        return t

    def weights(self, reader) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the file the decoder runs, model-named, transformers-valued
        (float32; a 3-D expert tensor as one matrix per expert)."""
        for tensor in reader.tensors:
            name = self.hf_name(tensor.name)
            if name is None:
                continue
            shape = tuple(int(d) for d in reversed(tensor.shape))
            yield from split_expert_weights(
                name, self.to_hf(name, dequantize(tensor.data, tensor.tensor_type, shape)))
