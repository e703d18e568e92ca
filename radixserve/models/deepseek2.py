"""DeepSeek-V3-style decoders with multi-head latent attention: GLM-4.7-Flash
(``Glm4MoeLiteForCausalLM``), DeepSeek-V3 (``DeepseekV3ForCausalLM``) and DeepSeek-V2
(``DeepseekV2ForCausalLM``), from folders and llama.cpp's ``deepseek2`` GGUF files; shapes in
models/deepseek2_config.py and deepseek2_gguf.py.

Each layer is Llama's pre-norm block (models/llama.py) with MLA attention (models/mla.py,
absorbed: the KV pool holds one latent row per token) and, after the first dense layers, a
sparse MoE block (layers/moe.py: sigmoid routing with the correction bias, grouped top-k,
routed scaling, ungated shared experts; DeepSeek-V2's softmax routing). Modules keep
transformers' names but for the MoE block's (``mlp.expert_bias``, ``mlp.shared_expert``:
deepseek2_config.py maps them); the layers run from Python (no native layer call has MLA),
their linears, norms and rope on the native kernels the checkpoint's format gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import DecoderLayer, LlamaForCausalLM, mlp_for
from radixserve.models.mla import MlaAttention
from radixserve.models.moe import unfuse_hf_experts


class MlaDecoderLayer(DecoderLayer):
    """Llama's layer (the residual stream added inside the next norm) with MLA attention."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MlaAttention(cfg, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp_for(cfg, layer_idx)


class Deepseek2ForCausalLM(LlamaForCausalLM):
    """The decoder of ``config.mla`` / ``config.moe``; weights under transformers' names
    (fused 3-D experts cut per expert), the MTP layers past ``num_layers`` skipped."""

    packed_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "gate_up_proj": ("gate_proj", "up_proj")}
    layers_in_python: ClassVar[str] = (
        "multi-head latent attention has no native layer call; its linears, norms and rope "
        "still run native kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if cfg.mla is None or cfg.moe is None:
            raise TypeError(f"{cfg.architecture} needs its MLA and MoE shapes")
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.mla.qk_rope_head_dim, cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(MlaDecoderLayer(cfg, i, self.rotary)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """transformers' names, or a GGUF file's ``k_b_proj`` / ``v_b_proj`` halves of
        ``kv_b_proj`` (models/deepseek2_gguf.py), joined back here."""
        super().load_weights(self._join_kv_b((name, t) for name, t in unfuse_hf_experts(weights)
                                             if not self._is_mtp(name)))

    def _join_kv_b(self, weights: Iterable[tuple[str, torch.Tensor]]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
        """``k_b_proj`` [H, kv_lora_rank, nope] (transposed by the converter) and ``v_b_proj``
        [H, v, kv_lora_rank] → ``kv_b_proj`` [H * (nope + v), kv_lora_rank], per head
        [k rows | v rows] as transformers stores it."""
        halves: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in weights:
            base, _, part = name.rpartition(".")[0].rpartition(".")
            if part not in ("k_b_proj", "v_b_proj"):
                yield name, t
                continue
            pair = halves.setdefault(base, {})
            pair[part] = t.transpose(1, 2) if part == "k_b_proj" else t
            if len(pair) == 2:
                kv_b = torch.cat((pair["k_b_proj"], pair["v_b_proj"]), dim=1)
                yield f"{base}.kv_b_proj.weight", kv_b.reshape(-1, kv_b.shape[-1])
                del halves[base]
        if halves:
            raise ValueError(f"weights missing from the checkpoint: one half of kv_b in "
                             f"{sorted(halves)[:3]}")

    def _is_mtp(self, name: str) -> bool:
        """DeepSeek-V3's multi-token-prediction layers, stored after the decoder's."""
        parts = name.removeprefix("model.").split(".")
        return parts[0] == "layers" and int(parts[1]) >= self.config.num_layers
