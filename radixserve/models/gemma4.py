"""Gemma 4 decoders (text; models/gemma4_config.py reads their shape). Each layer:

    h = x + post_attn_norm(attention(input_norm(x)))
    h = h + post_ffw_norm(mlp(pre_ffw_norm(h)))      (26B-A4B: + experts, models/gemma4_moe.py)
    h = h + post_per_layer_norm(proj(gelu(gate(h)) * per_layer_input))   (E2B / E4B)
    out = h * layer_scalar

Attention, shared KV and the pool's views: models/gemma4_attention.py. Per-layer inputs: the
table [per_layer_vocab, layers x per_layer_dim] is read a row per token (models/gemma4_ple.py).

The layers run in Python (``layers_in_python``); the attention is the step's backend (heads
over 256 dims run the torch backend: runner/kv_cache.py ``torch_for_wide_heads``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import image_rows, splice_images
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.gemma4_attention import Gemma4Attention, Rotaries, SharedKV
from radixserve.models.gemma4_moe import attach_moe, gemma4_expert_parts, moe_ffn, unfuse_experts
from radixserve.models.gemma4_ple import add_per_layer_inputs, load_table_, per_layer_inputs


class Gemma4MLP(nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, eps, g = cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma4
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Gemma4Attention(cfg, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        wide = 2 if layer_idx in g.double_wide_layers else 1
        self.mlp = Gemma4MLP(hidden, cfg.intermediate_size * wide)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.is_moe = g.num_experts > 0
        if self.is_moe:
            attach_moe(self, cfg)
        self.layer_scalar = nn.Parameter(torch.ones(1))
        self.per_layer_input_gate = self.per_layer_projection = None
        if g.per_layer_dim:
            self.per_layer_input_gate = nn.Linear(hidden, g.per_layer_dim, bias=False)
            self.per_layer_projection = nn.Linear(g.per_layer_dim, hidden, bias=False)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                per_layer_input: torch.Tensor | None, shared: SharedKV) -> torch.Tensor:
        h = self.self_attn(positions, self.input_layernorm(x), shared)
        x = x + self.post_attention_layernorm(h)
        ffn = self.mlp(self.pre_feedforward_layernorm(x))
        if self.is_moe:
            ffn = moe_ffn(self, x, ffn)
        x = x + self.post_feedforward_layernorm(ffn)
        if self.per_layer_input_gate is not None:
            h = F.gelu(self.per_layer_input_gate(x), approximate="tanh") * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(h))
        return x * self.layer_scalar


class Gemma4ForCausalLM(nn.Module):
    """Gemma 4 (text). Weights use Hugging Face names (``model.`` prefix optional)."""

    layers_in_python = "Gemma 4's layers (per-layer inputs, shared KV) run in Python"
    takes_images: ClassVar[bool] = True  # the image encoder's rows replace image tokens
    hf_expert_parts = staticmethod(gemma4_expert_parts)  # 16-bit-stored folders' 3-D experts

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.gemma4 is None or cfg.kv_shapes is None:
            raise ValueError(f"{cfg.architecture} needs Gemma 4 parameters in its ModelConfig")
        self.config, g = cfg, cfg.gemma4
        local = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, g.rope_local_theta,
                                None)
        global_dim = next(d for i, (_, d) in enumerate(cfg.kv_shapes)
                          if cfg.layer_window(i) is None)
        full = RotaryEmbedding(global_dim, cfg.max_position_embeddings, g.global_rope_theta,
                               g.global_rope_scaling(global_dim))
        self.rotary = Rotaries(local, full)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.has_per_layer = g.per_layer_dim > 0
        if self.has_per_layer:
            add_per_layer_inputs(self, cfg)
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(cfg, i, local if cfg.layer_window(i) is not None else full)
            for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None

    @property
    def images_bidirectional(self) -> tuple[int, ...]:
        """The pool layers whose attention sees a whole image from each of its rows: the
        sliding ones where the checkpoint says so (``use_bidirectional_attention`` "vision";
        transformers keeps the global layers causal), else none."""
        cfg = self.config
        if not cfg.gemma4.vision_bidirectional:
            return ()
        return tuple(p for p, layer in enumerate(cfg.attention_layers)
                     if cfg.layer_window(layer) is not None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed batch [T] → final hidden states [T, hidden]."""
        self.rotary.check_positions(positions)
        x = self.embed_tokens(input_ids)
        x = splice_images(x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype))
        per_layer = None
        if self.has_per_layer:  # image rows read the pad token's row of the per-layer table
            rows = image_rows()
            ids = (input_ids if rows is None
                   else input_ids.index_fill(0, rows, self.config.gemma4.pad_token_id))
            per_layer = per_layer_inputs(self, ids, x)
        shared: SharedKV = {}
        for i, layer in enumerate(self.layers):
            x = layer(positions, x, None if per_layer is None else per_layer[:, i], shared)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:  # tied to the embedding
            logits = torch.matmul(hidden, self.embed_tokens.weight.t()).float()
        else:
            logits = self.lm_head(hidden).float()
        cap = self.config.gemma4.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors (3-D expert tensors cut per expert); a shared-KV layer's K/V
        projections and norms, which it does not use, are skipped. ValueError on a missing or
        unexpected tensor or a wrong shape."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in unfuse_experts(weights):
            name = _module_name(name)
            if name is None or name == "lm_head.weight" and self.lm_head is None:
                continue
            param = params.get(name)
            if param is None:
                if _is_unused_shared_kv(self, name):
                    continue
                raise ValueError(f"unexpected weight {name!r}")
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(param.shape)}")
            if name == "embed_tokens_per_layer.weight":  # the big table: no second copy
                load_table_(self.embed_tokens_per_layer, tensor)
            else:
                param.data.copy_(tensor)
            loaded.add(name)
        missing = [n for n in params if n not in loaded]
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''}")


def _module_name(name: str) -> str | None:
    """A checkpoint name → this module's; None for buffers transformers saves but recomputes
    (rope frequencies)."""
    name = name.removeprefix("model.")
    return None if "rotary_emb" in name else name


def _is_unused_shared_kv(model: Gemma4ForCausalLM, name: str) -> bool:
    parts = name.split(".")
    if (len(parts) < 4 or parts[0] != "layers" or parts[2] != "self_attn"
            or not parts[1].isdigit() or int(parts[1]) >= len(model.layers)):
        return False
    attn = model.layers[int(parts[1])].self_attn
    return not attn.owns_kv and parts[3] in ("k_proj", "v_proj", "k_norm", "v_norm")
