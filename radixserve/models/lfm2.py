"""Liquid LFM2 / LFM2.5 decoders, dense and MoE (LFM2-8B-A1B): a hybrid of gated short-conv
layers and GQA attention layers (``ModelConfig.linear_attn``: a ``ShortConvParams``, the
``conv`` layers ``LINEAR``), every layer pre-norm with a SwiGLU MLP (or a sparse MoE block).

- Short conv (``ShortConv``, transformers' ``Lfm2ShortConv``): ``in_proj`` gives B, C and x;
  B * x goes through a depthwise causal conv (``conv_kernel`` taps, no bias, no activation)
  whose window of the last K-1 inputs is the layer's only state (one slot per sequence:
  runner/recurrent_state.py; layers/gated_deltanet.py's ``causal_conv``); C times the conv's
  output goes through ``out_proj``.
- Attention: Llama's (models/llama.py) with q/k RMSNorms, over the KV pool's layer
  ``kv_index`` (only attention layers have one: ``ModelConfig.kv_view``).
- The final norm is transformers' ``embedding_norm`` (applied after the last layer, despite
  its name); the head is usually tied to the embedding.

Modules use Llama's names (models/lfm2_config.py maps transformers' and llama.cpp's to them):
q/k/v and gate/up fused at load. LFM2-MoE's router scores by sigmoid, with an expert bias
used only to pick the experts (layers/moe.py; ``ModelConfig.moe``).

NOTE: batch invariance: the gates B * x and C * conv are single float multiplies per
element, exact whatever vector loop computes them, so a row's value never depends on its
place in the batch; the conv is exact elementwise arithmetic too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.gated_deltanet import causal_conv
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import Attention, LlamaForCausalLM, mlp_for
from radixserve.models.moe import unfuse_hf_experts
from radixserve.recurrent_params import ShortConvParams


class ShortConv(nn.Module):
    """transformers' ``Lfm2ShortConv`` over a packed batch, its conv windows in the forward
    context's slots (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        hidden, kernel = cfg.hidden_size, cfg.linear_attn.conv_kernel
        self.layer_idx = layer_idx
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=False)  # rows: B, C, x
        self.conv = nn.Module()  # transformers' names: conv.weight [hidden, 1, K], held [hidden, K]
        self.conv.weight = nn.Parameter(torch.empty(hidden, kernel))
        self.out_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        states = get_forward_context().states
        conv = causal_conv(b * h, self.conv.weight, states.conv[self.layer_idx],
                           states.cu_seqlens, states.slots, states.snapshots, activation=None)
        return self.out_proj(c * conv)


class Lfm2DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # operator_norm
        self.is_conv = cfg.linear_attn.is_linear(layer_idx)
        if self.is_conv:
            self.conv = ShortConv(cfg, layer_idx)
        else:  # NOTE: Llama's Attention reads the KV pool's layer ``layer_idx``: the kv index
            self.self_attn = Attention(cfg, cfg.attention_layers.index(layer_idx), rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # ffn_norm
        self.mlp = mlp_for(cfg, layer_idx)  # dense, or sparse MoE where cfg.moe says

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (the MLP's output, the stream before it), as in models/llama.py."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = (self.conv if self.is_conv else self.self_attn)(positions, h)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class Lfm2ForCausalLM(LlamaForCausalLM):
    """LFM2 / LFM2-MoE text decoder; weights under the model's names (lfm2_config.py maps a
    checkpoint's), the conv kernels [hidden, 1, K] (transformers) or [hidden, K] (GGUF)."""

    # why the layers are not one native call each (models/native_stack.py: plan_kernels)
    layers_in_python: ClassVar[str] = (
        "LFM2's short-conv layers have no native layer call; their linears still run native "
        "kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if not isinstance(cfg.linear_attn, ShortConvParams):
            raise TypeError(f"{cfg.architecture} needs its short-conv layout")
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, cfg.rotary_dim)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Lfm2DecoderLayer(cfg, i, self.rotary)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # embedding_norm
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Model-named tensors (experts one by one or fused 3-D). ValueError on a missing or
        unexpected tensor."""
        super().load_weights(_conv_kernels_2d(unfuse_hf_experts(weights)))


def _conv_kernels_2d(weights: Iterable[tuple[str, torch.Tensor]]):
    for name, tensor in weights:
        if name.endswith("conv.conv.weight") and tensor.dim() == 3:
            yield name, tensor.squeeze(1)  # [hidden, 1, K] → [hidden, K]
        else:
            yield name, tensor
