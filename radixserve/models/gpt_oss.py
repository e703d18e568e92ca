"""gpt-oss decoder (``GptOssForCausalLM``; models/gpt_oss_config.py reads its shape): the
Llama-family decoder (pre-norms, fused q/k/v and gate/up) with

- q / k / v / o biases and an attention sink per query head: a learned logit that joins the
  softmax's denominator only (the attention backends' ``sinks``);
- sliding-window (128) and full layers alternating, one yarn rope for both;
- a MoE block in every layer (layers/moe.py): router with a bias, softmax over its top-k
  logits, experts with biases and the clamped SwiGLU (``OaiExpert``).

A Hugging Face folder stores the experts fused (``experts.gate_up_proj`` [E, hidden, 2 * I]
with gate and up columns interleaved, ``experts.down_proj`` [E, I, hidden], their ``_bias``)
and the router as ``mlp.router`` (``mlp.gate`` here: gpt_oss_config.gpt_oss_hf_name);
``load_weights`` and ``hf_expert_parts`` cut them into the per-expert matrices the model
holds. llama.cpp's GGUF files store them per kind (``ffn_gate_exps`` ...; MXFP4 in the
releases), as the model holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import Attention, DecoderLayer, mlp_for
from radixserve.models.moe import MoeForCausalLM


class GptOssAttention(Attention):
    """Llama's attention with an output bias where q / k / v have theirs (transformers'
    ``attention_bias``) and ``sinks`` [H] (float32), passed to the backend."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__(cfg, layer_idx, rotary)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.sinks = nn.Parameter(torch.empty(cfg.num_heads), requires_grad=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[self.layer_idx],
                                  ctx.layer_metadata[self.layer_idx], self.scale, self.window,
                                  None, sinks=self.sinks.float())
        return self.o_proj(out.view(n, -1))


class GptOssDecoderLayer(DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = GptOssAttention(cfg, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp_for(cfg, layer_idx)


class GptOssForCausalLM(MoeForCausalLM):
    """gpt-oss-20b / 120b (text); weights by Hugging Face names (GGUF ones mapped by
    gpt_oss_config.gpt_oss_gguf_name)."""

    # why the layers are not one native call each (models/native_stack.py: plan_kernels)
    layers_in_python: ClassVar[str] = (
        "attention sinks and MoE blocks have no native layer call; their linears and "
        "attention still run native kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling, cfg.rotary_dim)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GptOssDecoderLayer(cfg, i, self.rotary)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Model-named tensors, a folder's fused experts among them (``split_hf``)."""
        super().load_weights(part for name, t in weights for part in split_hf(name, t))

    @staticmethod
    def hf_expert_parts(name: str, shape) -> list[tuple[str, Callable]] | None:
        """For the 16-bit-as-stored load (models/half_stored.py): a fused expert tensor of
        ``shape`` → (each expert matrix's or bias's name, what makes it of the tensor's
        safetensors slice, reading that expert's slab only); None for any other tensor."""
        views = expert_views(name, int(shape[0]))
        if views is None:
            return None
        return [(part, lambda s, e=e, view=view: view(s[(e,)])) for part, e, view in views]


_FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_bias",
          "mlp.experts.down_proj", "mlp.experts.down_proj_bias")


def expert_views(name: str, num_experts: int) -> list[tuple[str, int, Callable]] | None:
    """A fused expert tensor ``name`` → (model name, expert e, what makes the model's tensor of
    expert e's slab) for each expert's ``gate_proj``, ``up_proj`` (the even and the odd
    columns of ``gate_up_proj``) and ``down_proj`` weights [out, in] (stored [in, out]) and
    biases; None for any other tensor."""
    kind = next((k for k in _FUSED if name.endswith(k)), None)
    if kind is None:
        return None
    prefix = name.removesuffix(kind) + "mlp.experts"
    suffix = "bias" if kind.endswith("_bias") else "weight"

    def matrix(w: torch.Tensor) -> torch.Tensor:
        return w if suffix == "bias" else w.t()

    if kind.startswith("mlp.experts.down_proj"):
        projs = (("down_proj", matrix),)
    else:
        projs = (("gate_proj", lambda w: matrix(w)[0::2]), ("up_proj", lambda w: matrix(w)[1::2]))
    return [(f"{prefix}.{e}.{proj}.{suffix}", e, view) for e in range(num_experts)
            for proj, view in projs]


def split_hf(name: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """One checkpoint tensor → the model's (name, tensor) pairs: a fused expert tensor as its
    experts' (``expert_views``), any other as it is."""
    views = expert_views(name, t.shape[0])
    if views is None:
        yield name, t
        return
    for part, e, view in views:
        yield part, view(t[e])
