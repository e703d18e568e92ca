"""IBM Granite decoders (models/granite_config.py lists the checkpoint kinds): Granite 3.x
dense and MoE, and the Granite 4.0-H / 4.1-H hybrids of Mamba2 and attention layers.

A layer is Llama's pre-norm block with Granite's multipliers (``ModelConfig.granite``)::

    h = mixer(input_layernorm(x))          attention, or Mamba2 (layers/mamba2.py)
    x = x + residual_multiplier * h
    h = post_attention_layernorm(x)
    h = mlp(h) + shared_mlp(h)             either may be absent (below)
    x = x + residual_multiplier * h

with the embeddings times ``embedding_multiplier``, the attention scale
``attention_multiplier`` (no RoPE where ``granite.rope`` is false: Granite 4.0-H) and the
logits divided by ``logits_scaling``. ``mlp``: Granite 3's dense MLP, or the sparse MoE block
(layers/moe.py: softmax router, renormalized top-k); none in a dense hybrid. ``shared_mlp``:
the ungated SwiGLU every token runs beside the experts (GraniteMoeShared, the hybrids; a dense
hybrid's only MLP). Attention and Mamba2 layers read the KV pool and the state slots as
models/qwen35.py's do.

The layers run one by one from Python (the native layer call has no residual multiplier and no
Mamba2 mixer); their linears, norms and activations run the native kernels the checkpoint's
format gets. The multiplications by a scalar are exactly rounded in any batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.mamba2 import Mamba2Mixer
from radixserve.layers.moe import Expert
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import Attention, LlamaForCausalLM, mlp_for
from radixserve.models.moe import unfuse_hf_experts
from radixserve.models.native_stack import NativeLayerStack


class NoRotary(nn.Module):
    """Attention without a position embedding: q and k as they are."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class GraniteDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: nn.Module) -> None:
        super().__init__()
        g = cfg.granite
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_linear = cfg.linear_attn is not None and cfg.linear_attn.is_linear(layer_idx)
        if self.is_linear:
            self.mamba = Mamba2Mixer(cfg, layer_idx)
        else:
            self.self_attn = Attention(cfg, cfg.attention_layers.index(layer_idx), rotary)
            self.self_attn.scale = g.attention_multiplier
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        shared = g.shared_intermediate_size
        self.mlp = mlp_for(cfg, layer_idx) if cfg.moe is not None or not shared else None
        self.shared_mlp = Expert(cfg.hidden_size, shared) if shared else None
        self.residual_multiplier = g.residual_multiplier

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (the MLPs' output times the residual multiplier, the stream before
        it); the stream is ``x + residual``, added inside the next norm (models/llama.py)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = (self.mamba if self.is_linear else self.self_attn)(positions, h)
        h, residual = self.post_attention_layernorm(h * self.residual_multiplier, residual)
        if self.mlp is None:
            out = self.shared_mlp(h)
        else:
            out = self.mlp(h)
            if self.shared_mlp is not None:
                out = out + self.shared_mlp(h)
        return out * self.residual_multiplier, residual


class GraniteForCausalLM(LlamaForCausalLM):
    """Any Granite decoder (see the module docstring); weights use the names granite_config.py's
    ``granite_hf_name`` gives a folder's (q/k/v and gate/up fused at load, fused 3-D experts cut
    per expert)."""

    layers_in_python: ClassVar[str] = (
        "Granite's residual multipliers (and Mamba2 layers) have no native layer call; their "
        "linears still run native kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if cfg.granite is None:
            raise ValueError(f"{cfg.architecture} needs its Granite multipliers")
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, cfg.rotary_dim)
        layer_rotary = self.rotary if cfg.granite.rope else NoRotary()
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GraniteDecoderLayer(cfg, i, layer_rotary)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed batch [T] → final hidden states [T, hidden] (models/llama.py's, the
        embeddings scaled)."""
        if self._stack is None:
            self._stack = NativeLayerStack.build(self)
        self.rotary.check_positions(positions)
        x = self.embed_tokens(input_ids) * self.config.granite.embedding_multiplier
        x, residual = self._stack(positions, x)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / self.config.granite.logits_scaling

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Model-named tensors (granite_config.py's ``granite_hf_name``, granite_gguf.py);
        ValueError on a missing or unexpected tensor."""
        super().load_weights(unfuse_hf_experts(weights))
