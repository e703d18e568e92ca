"""Gemma 2 and Gemma 3 decoders (text): the Llama layout (models/llama.py's attention, fused
q/k/v and gate/up) with Gemma's differences:

- embeddings scaled by sqrt(hidden) (in the embedding's dtype, as transformers does);
- RMSNorm multiplying by (1 + w): the norms here hold 1 + w, so the plain RMSNorm (and its
  native kernel) applies; config.json's w gets 1 added at load, a GGUF's norms are stored so;
- a norm before and after both attention and the MLP; GeGLU (gelu, tanh approximation);
- sliding-window layers beside global ones (``ModelConfig.layer_window``), each with its own
  rope (Gemma 3: base ``rope_local_theta`` for sliding layers, ``rope_theta`` and the rope
  scaling for global ones); q/k norms (Gemma 3);
- queries scaled by ``query_pre_attn_scalar ** -0.5``; tanh soft-caps on the attention scores
  and the final logits (Gemma 2).

The layer stack is the model's ``KernelPlan``'s, as for Llama: one native call per layer
(decoder_layer.cpp, which has Gemma's four norms, q/k norms, GeGLU, soft-cap and the layer's
own rope tables) where every piece runs a native kernel, else the Python layers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from radixserve.model_config import ModelConfig
from radixserve.layers.activation import gelu_tanh_and_mul
from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import splice_images
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.models.gemma_config import GGUF_NORM_SUFFIX
from radixserve.models.llama import Attention, LlamaForCausalLM
from radixserve.models.native_stack import NativeLayerStack


class GemmaMLP(nn.Module):
    activation: ClassVar[str] = "gelu_tanh"  # the native layer's name for it (native_stack.py)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.native = False  # the activation's kernel, set by the model's KernelPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x), self.native))


class GemmaDecoderLayer(nn.Module):
    # the norms by their place in the native layer's sequence (kernels/ops.py: NORM_PLACES): the
    # one before the MLP, added to the residual, is the pre-feedforward norm here
    native_norms: ClassVar[dict[str, str]] = {
        "input_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
        "post_norm": "pre_feedforward_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = Attention(cfg, layer_idx, rotary)
        self.self_attn.scale = cfg.gemma.query_pre_attn_scalar ** -0.5
        self.self_attn.softcap = cfg.gemma.attn_logit_softcapping
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = GemmaMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (this layer's normed MLP output, the stream before it), the stream
        being ``x + residual`` (added inside the next norm, as in models/llama.py)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(positions, h))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class _Rotaries(nn.Module):
    """The sliding layers' and the global layers' rope tables, set, reset and checked together
    (the loader and the engine call these on ``model.rotary``, see layers/rotary.py)."""

    def __init__(self, local: RotaryEmbedding, full: RotaryEmbedding) -> None:
        super().__init__()
        self.local, self.full = local, full

    def reset_tables(self, device: torch.device | None = None) -> None:
        self.local.reset_tables(device)
        self.full.reset_tables(device)

    def set_context_len(self, context_len: int) -> None:
        self.local.set_context_len(context_len)
        self.full.set_context_len(context_len)

    def check_positions(self, positions: torch.Tensor) -> None:
        self.full.check_positions(positions)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 / Gemma 3 (text). Weights use Hugging Face names, as in LlamaForCausalLM.
    With Gemma 3's vision encoder, image rows attend to their whole image (transformers'
    ``token_type_ids`` mask; runner/image_embeds.py)."""

    takes_images: ClassVar[bool] = True
    images_bidirectional: ClassVar[bool] = True

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if cfg.gemma is None:
            raise ValueError(f"{cfg.architecture} needs Gemma parameters in its ModelConfig")
        self.config = cfg
        full = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                               cfg.rope_scaling)
        local = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings,
                                cfg.gemma.rope_local_theta, None)
        self.rotary = _Rotaries(local, full)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, i, local if cfg.layer_window(i) is not None else full)
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed batch [T] → final hidden states [T, hidden] (the layer stack of its
        ``kernel_plan``, see LlamaForCausalLM.forward)."""
        if self._stack is None:
            self._stack = NativeLayerStack.build(self)
        self.rotary.check_positions(positions)
        x = self.embed_tokens(input_ids)
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        x = splice_images(x)  # Gemma 3's image rows: the projector's output, not scaled
        x, residual = self._stack(positions, x)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.gemma.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors (norms as config.json stores them, w: 1 + w is kept) or a GGUF
        file's (``<norm>.gguf_weight``: already 1 + w). ValueError on a missing or unexpected
        tensor."""
        super().load_weights(_norms_as_multipliers(weights))


def _norms_as_multipliers(weights: Iterable[tuple[str, torch.Tensor]]):
    for name, tensor in weights:
        if name.endswith(f".{GGUF_NORM_SUFFIX}"):
            yield name.removesuffix(GGUF_NORM_SUFFIX) + "weight", tensor
        elif name.endswith("norm.weight"):
            yield name, tensor + 1.0
        else:
            yield name, tensor
