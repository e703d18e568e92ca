"""Llama-family decoder: Llama 2/3, SmolLM2, Mistral (sliding window), Qwen2/2.5 (qkv bias),
Qwen3 (q/k norm), Phi-3 / Phi-4 (fused checkpoints, longrope, partial rotary).

Weights use Hugging Face names; q/k/v and gate/up are fused into one matmul each at load (or
arrive fused, as Phi-3 stores them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn

from radixserve.model_config import ModelConfig
from radixserve.layers.activation import silu_and_mul
from radixserve.layers.embedding import empty_embedding
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack
from radixserve.layers.forward_context import get_forward_context, splice_images


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary
        self.scale = cfg.head_dim ** -0.5
        self.window = cfg.layer_window(layer_idx)  # sliding-window attention (Mistral), or None
        self.softcap: float | None = None  # attention logit soft-capping (Gemma 2)
        self.split = (cfg.q_size, cfg.kv_size, cfg.kv_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[self.layer_idx],
                                  ctx.layer_metadata[self.layer_idx], self.scale, self.window,
                                  self.softcap)
        return self.o_proj(out.view(num_tokens, -1))


class MLP(nn.Module):
    activation: ClassVar[str] = "silu"  # the native layer's name for it (native_stack.py)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.native = False  # the activation's kernel, set by the model's KernelPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), self.native))


def mlp_for(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The layer's MLP: dense, or a sparse MoE block where ``cfg.moe`` says (layers/moe.py)."""
    if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
        from radixserve.layers.moe import SparseMoeBlock

        return SparseMoeBlock(cfg.hidden_size, cfg.moe)
    return MLP(cfg)


class DecoderLayer(nn.Module):
    # the norms by their place in the native layer's sequence (kernels/ops.py: NORM_PLACES)
    native_norms: ClassVar[dict[str, str]] = {"input_norm": "input_layernorm",
                                              "post_norm": "post_attention_layernorm"}

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp_for(cfg, layer_idx)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (this layer's MLP output, the residual stream before it); the
        stream is ``x + residual``, added inside the next norm (vLLM's fused add + norm)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(positions, h)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    # takes the step's image rows after the embedding (SmolVLM; runner/image_embeds.py), and
    # adds deepstack rows to the first layers' outputs (Qwen3-VL: its layer stacks do)
    takes_images: ClassVar[bool] = True
    takes_deepstack: ClassVar[bool] = True
    # fused linear → the checkpoint's matrices stacked in it, in order (vLLM's
    # packed_modules_mapping): load_weights and the 4-bit layers (models/quantization.py) use it
    packed_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # NOTE: a subclass with a forward of its own takes images only where it says so: its
        # forward may not splice them
        if "forward" in cls.__dict__ and "takes_images" not in cls.__dict__:
            cls.takes_images = False
        if "forward" in cls.__dict__ and "takes_deepstack" not in cls.__dict__:
            cls.takes_deepstack = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                 cfg.rope_scaling, cfg.rotary_dim)
        self.rotary = rotary
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None  # what runs natively, set when its runner is built
        self._stack: NativeLayerStack | PythonLayerStack | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed batch [T] → final hidden states [T, hidden]. The layer stack (one native call
        per layer where they all run native kernels) is the one ``kernel_plan`` chose, see
        models/native_stack.py."""
        if self._stack is None:
            self._stack = NativeLayerStack.build(self)
        self.rotary.check_positions(positions)
        x = splice_images(self.embed_tokens(input_ids))
        x, residual = self._stack(positions, x)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:  # tied to the embedding
            return torch.matmul(hidden, self.embed_tokens.weight.t()).float()
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors, fusing q/k/v and gate/up. Raises ValueError on a missing or
        unexpected tensor."""
        params = dict(self.named_parameters())
        fused = {shard: (target, i) for target, shards in self.packed_modules.items()
                 for i, shard in enumerate(shards)}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            parts = name.split(".")
            shard = fused.get(parts[-2]) if len(parts) >= 2 else None
            if shard is not None:
                target, idx = shard
                name = ".".join(parts[:-2] + [target, parts[-1]])
                param = params.get(name)
                if param is None:
                    raise ValueError(f"unexpected weight {name!r}")
                offset, size = self._shard_range(target, idx, param.shape[0])
                _copy(param.data[offset:offset + size], tensor, name)
                loaded.add(f"{name}#{idx}")
                continue
            param = params.get(name)
            if param is None:
                raise ValueError(f"unexpected weight {name!r}")
            _copy(param.data, tensor, name)
            loaded.update(self._loaded_names(name))
        missing = [n for n in self._expected_names() if n not in loaded]
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''}")

    def _loaded_names(self, name: str) -> list[str]:
        """A whole tensor's names in ``_expected_names``: a fused layer stored already fused
        (Phi-3's ``qkv_proj``, ``gate_up_proj``) fills all its shards."""
        parts = name.split(".")
        shards = self.packed_modules.get(parts[-2]) if len(parts) >= 2 else None
        return [name] if shards is None else [f"{name}#{i}" for i in range(len(shards))]

    def _shard_range(self, target: str, idx: int, rows: int) -> tuple[int, int]:
        cfg = self.config
        if target == "qkv_proj":
            sizes = (cfg.q_size, cfg.kv_size, cfg.kv_size)
        else:  # gate and up halves (a dense MLP's or an expert's)
            sizes = (rows // 2, rows // 2)
        return sum(sizes[:idx]), sizes[idx]

    def _expected_names(self) -> list[str]:
        names = []
        for name, _ in self.named_parameters():
            if ".qkv_proj." in name:
                names += [f"{name}#{i}" for i in range(3)]
            elif ".gate_up_proj." in name:
                names += [f"{name}#{i}" for i in range(2)]
            else:
                names.append(name)
        return names


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"weight {name!r} has shape {tuple(src.shape)}, "
                         f"expected {tuple(dst.shape)}")
    dst.copy_(src)
