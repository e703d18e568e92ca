"""Qwen3.5 / 3.6 decoders, dense and MoE (text): a hybrid of Gated DeltaNet layers (linear
attention with a recurrent state) and gated full-attention layers, usually three of the former
before each of the latter (``ModelConfig.linear_attn.layer_types``).

- Gated DeltaNet (``GatedDeltaNet``): q, k, v through a causal depthwise conv (kernel 4, SiLU)
  whose window is carried between steps, then the gated delta rule over a per-head
  ``key_dim x value_dim`` state (layers/gated_deltanet.py: both ops take the step's states
  from the forward context, one slot per sequence: runner/recurrent_state.py), an RMSNorm of
  each head's output gated by SiLU(z), and the output projection.
- Gated attention (``GatedAttention``): ``q_proj`` gives each head's query and an output gate
  (interleaved per head: [q_h | gate_h]), q/k RMSNorms, RoPE on the first
  ``rotary_dim`` dims (Qwen3.5 uses interleaved mRoPE; for text the three position streams
  are equal and it is plain RoPE), the output times sigmoid(gate). Its KV is the pool's layer
  ``kv_index``: only attention layers have one (``ModelConfig.kv_view``).
- RMSNorms multiply by (1 + w) (zero-centred weights) everywhere but in the DeltaNet output
  norm: the norms here hold 1 + w, added at load, so the plain RMSNorm applies.
- The MLP: dense SwiGLU, or for the MoE models (``Qwen3_5MoeForCausalLM``, 35B-A3B /
  122B-A10B: ``ModelConfig.moe``) a sparse MoE block with a gated shared expert in every layer
  (layers/moe.py); their checkpoints' fused 3-D expert tensors are cut per expert at load.

The layers run one by one from Python (no native layer call has these mixers); their linears
run the native kernels the checkpoint's format gets. The elementwise gates (sigmoid, softplus,
SiLU) run native kernels too where the norms do (``native``, set by the kernel plan): torch's
vectorized loops round a value differently in their scalar tail, so a row's result would
depend on where it sits in the batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels import recurrent_ops
from radixserve.layers.activation import silu_and_mul
from radixserve.layers.embedding import empty_embedding
from radixserve.layers.forward_context import get_forward_context
from radixserve.layers.gated_deltanet import causal_conv, gated_delta_rule
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import LlamaForCausalLM, mlp_for
from radixserve.models.moe import unfuse_hf_experts

# the (1 + w) norms' names end so; load_weights adds the 1 (``DeltaNet.norm`` is plain w)
_ONE_PLUS_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                   "q_norm.weight", "k_norm.weight", "pre_fc_norm_embedding.weight",
                   "pre_fc_norm_hidden.weight")
_ONE_PLUS_TOP = ("norm.weight", "model.norm.weight", "mtp.norm.weight")


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, kv_index: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.kv_index = kv_index
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        # rows: per head its query then its gate (2 * q_size), then k and v
        self.qkv_proj = nn.Linear(cfg.hidden_size, 2 * cfg.q_size + 2 * cfg.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary
        self.scale = cfg.head_dim ** -0.5
        self.split = (2 * cfg.q_size, cfg.kv_size, cfg.kv_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        qg, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q, gate = qg.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q.contiguous())
        k = self.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim))
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[self.kv_index],
                                  ctx.layer_metadata[self.kv_index], self.scale, None, None)
        gate = gate.reshape(n, -1)
        if self.q_norm.native and out.dtype == torch.float32:
            out = recurrent_ops.sigmoid_mul(out.reshape(n, -1).contiguous(), gate)
        else:
            out = out.view(n, -1) * torch.sigmoid(gate)
        return self.o_proj(out)


class GatedDeltaNet(nn.Module):
    """Transformers' ``Qwen3_5GatedDeltaNet`` over a packed batch, its states in the forward
    context's slots (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        la = cfg.linear_attn
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = la.num_key_heads, la.num_value_heads
        self.head_k_dim, self.head_v_dim = la.key_head_dim, la.value_head_dim
        key_dim = la.num_key_heads * la.key_head_dim
        value_dim = la.num_value_heads * la.value_head_dim
        self.split = (key_dim, key_dim, value_dim)
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, la.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, la.num_value_heads, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, la.num_value_heads, bias=False)
        self.conv1d = nn.Module()  # transformers' names: conv1d.weight [conv_dim, 1, K]
        self.conv1d.weight = nn.Parameter(torch.empty(la.conv_dim, 1, la.conv_kernel))
        self.dt_bias = nn.Parameter(torch.ones(la.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(la.num_value_heads))
        self.norm = RMSNorm(la.value_head_dim, cfg.rms_norm_eps)  # plain w, gated below
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        states = get_forward_context().states
        qkv, z, a, b = self._project(x)
        mixed = causal_conv(qkv, self.conv1d.weight[:, 0],
                            states.conv[self.layer_idx], states.cu_seqlens, states.slots,
                            states.snapshots)
        q, k, v = mixed.split(self.split, dim=-1)
        q = q.reshape(n, self.num_k_heads, self.head_k_dim)
        k = k.reshape(n, self.num_k_heads, self.head_k_dim)
        v = v.reshape(n, self.num_v_heads, self.head_v_dim)
        g, beta = self._gates(a, b)
        out = gated_delta_rule(q, k, v, g, beta, states.ssm[self.layer_idx],
                               states.cu_seqlens, states.slots, states.snapshots)
        z = z.reshape(-1, self.head_v_dim)
        out = self.norm(out.reshape(-1, self.head_v_dim).float())
        if self.norm.native:  # silu(z) * out: the MLPs' kernel, on [z | out] rows
            out = silu_and_mul(torch.cat([z.float(), out], dim=-1), True)
        else:
            out = out * F.silu(z.float())
        return self.out_proj(out.to(x.dtype).reshape(n, -1))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(qkv [T, conv_dim], z [T, value_dim], a, b [T, num_value_heads]): the input
        projections (a subclass may hold them fused: models/qwen3next.py)."""
        return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_a(x), self.in_proj_b(x)

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta): the state's log decay and the update's weight per token and head."""
        if self.norm.native:
            return recurrent_ops.gdn_gates(a.float(), b.float(), self.A_log.float(),
                                           self.dt_bias.float())
        beta = torch.sigmoid(b)
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias), beta


class Qwen35DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: RotaryEmbedding,
                 linear_attn_cls: type[GatedDeltaNet] = GatedDeltaNet) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        is_mtp = layer_idx >= cfg.num_layers  # an MTP layer: full attention, its own KV layer
        self.is_linear = not is_mtp and cfg.linear_attn.is_linear(layer_idx)
        if self.is_linear:
            self.linear_attn = linear_attn_cls(cfg, layer_idx)
        else:
            kv_index = (len(cfg.attention_layers) + layer_idx - cfg.num_layers if is_mtp
                        else cfg.attention_layers.index(layer_idx))
            self.self_attn = GatedAttention(cfg, kv_index, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp_for(cfg, layer_idx)  # dense, or sparse MoE where cfg.moe says (35B-A3B)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (the MLP's output, the stream before it), as in models/llama.py."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = (self.linear_attn if self.is_linear else self.self_attn)(positions, h)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class Qwen35ForCausalLM(LlamaForCausalLM):
    """Qwen3.5 text decoder, dense or MoE; weights use transformers' names (q/k/v and gate/up
    fused at load, the (1 + w) norms stored as 1 + w, experts one by one or fused 3-D)."""

    # why the layers are not one native call each (models/native_stack.py: plan_kernels)
    layers_in_python: ClassVar[str] = (
        "Gated DeltaNet and gated attention have no native layer call; their linears still "
        "run native kernels")
    linear_attn_cls: ClassVar[type[GatedDeltaNet]] = GatedDeltaNet  # Qwen3-Next's: fused inputs
    # Qwen3.5's vision tower's rows replace the image tokens' embeddings: the forward is
    # LlamaForCausalLM's, which splices them right after the embedding (splice_images)
    takes_images: ClassVar[bool] = True

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if cfg.linear_attn is None:
            raise ValueError(f"{cfg.architecture} needs its linear-attention layout")
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, cfg.rotary_dim)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen35DecoderLayer(cfg, i, self.rotary, self.linear_attn_cls)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        # the multi-token-prediction block, when it runs (--speculative mtp)
        self.mtp = MtpBlock(cfg, self.rotary) if cfg.num_mtp_layers else None
        self.kernel_plan = None
        self._stack = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Transformers-named tensors (models/qwen35_gguf.py maps a GGUF's to them); the MTP
        block's (``mtp.*``) are left out unless it runs. ValueError on a missing or unexpected
        tensor."""
        if self.mtp is None:
            weights = ((n, t) for n, t in weights if not n.startswith(("mtp.", "model.mtp.")))
        super().load_weights(_one_plus_norms(unfuse_hf_experts(weights)))

    def mtp_hidden(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                   positions: torch.Tensor, step: int = 0) -> torch.Tensor:
        """The MTP block on a packed batch (runner/mtp_runner.py sets the forward context):
        at each position, the final hidden state there (``hidden``: this model's output, or
        the block's own from the position before) and the token that follows it
        (``input_ids``) → a hidden state whose logits (``compute_logits``) predict the token
        after that one."""
        return self.mtp(self.embed_tokens(input_ids), hidden, positions, step)

    def _shard_range(self, target: str, idx: int, rows: int) -> tuple[int, int]:
        if target != "qkv_proj":
            return super()._shard_range(target, idx, rows)
        cfg = self.config
        sizes = (2 * cfg.q_size, cfg.kv_size, cfg.kv_size)
        return sum(sizes[:idx]), sizes[idx]


class MtpBlock(nn.Module):
    """Qwen3.5's / Qwen3-Next's multi-token prediction (checkpoint names ``mtp.*``; vLLM's
    ``Qwen3NextMultiTokenPredictor`` computes the same): the next token's embedding and the
    current hidden state, each RMS-normed, concatenated and projected (``fc``), then a full
    decoder layer (gated attention over a KV layer of its own, the model's MLP or MoE) and a
    final norm. The model's embedding and head are shared."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList(Qwen35DecoderLayer(cfg, cfg.num_layers + i, rotary)
                                    for i in range(cfg.num_mtp_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                step: int = 0) -> torch.Tensor:
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds),
                               self.pre_fc_norm_hidden(hidden)], dim=-1))
        x, residual = self.layers[step % len(self.layers)](positions, x, None)
        return self.norm(x, residual)[0]


def _one_plus_norms(weights: Iterable[tuple[str, torch.Tensor]]):
    for name, tensor in weights:
        if name.endswith(_ONE_PLUS_NORMS) or name in _ONE_PLUS_TOP:
            yield name, tensor + 1.0
        else:
            yield name, tensor
