"""OLMo 2 and OLMo 3 decoders (models/olmo2_config.py reads their shapes): Llama's attention
and SwiGLU MLP with OLMo's norms:

- no norm before attention or the MLP; an RMSNorm of the attention output and one of the MLP
  output, each before it is added to the residual stream (``post_attention_layernorm``,
  ``post_feedforward_layernorm``);
- q / k RMSNorms over the whole q / k width (all heads together), before rope;
- OLMo 3: sliding-window layers beside full ones, each kind with its rope
  (models/layer_rope.py).

The layers run one by one from Python (decoder_layer.cpp has a norm before attention and
per-head q / k norms only); their linears, norms, rope and attention run the kernels the
checkpoint and the backend get.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.layer_rope import layer_rotaries
from radixserve.models.llama import MLP, Attention, LlamaForCausalLM


class OlmoAttention(Attention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__(cfg, layer_idx, rotary)
        self.q_norm = RMSNorm(cfg.q_size, cfg.rms_norm_eps)  # the whole width, not per head
        self.k_norm = RMSNorm(cfg.kv_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = self.q_norm(q.contiguous()).view(n, self.num_heads, self.head_dim)
        k = self.k_norm(k.contiguous()).view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[self.layer_idx],
                                  ctx.layer_metadata[self.layer_idx], self.scale, self.window,
                                  self.softcap)
        return self.o_proj(out.view(n, -1))


class OlmoDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = OlmoAttention(cfg, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (the normed MLP output, the stream before it), the stream being
        ``x + residual`` (as in models/llama.py; here the sum is made first, since the norms
        come after the attention and the MLP, not before them)."""
        stream = x if residual is None else x + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(positions, stream))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 / OLMo 3 (text); weights use Hugging Face names, as in LlamaForCausalLM."""

    # why the layers are not one native call each (models/native_stack.py: plan_kernels)
    layers_in_python: ClassVar[str] = (
        "OLMo's norms after attention and the MLP and whole-width q/k norms have no native "
        "layer call; their linears still run native kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = cfg
        self.rotary, per_layer = layer_rotaries(cfg)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(OlmoDecoderLayer(cfg, i, rotary)
                                    for i, rotary in enumerate(per_layer))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None
