"""NVIDIA Nemotron-H decoders, dense and MoE (``NemotronHForCausalLM``: Nemotron-H 8B / 47B,
Nemotron Nano 9B / 12B v2, Nemotron 3 Nano 30B-A3B): each layer is ONE pre-norm block with a
residual around one mixer (models/nemotron_h_config.py reads which, ``ModelConfig.linear_attn``
and ``.moe`` hold it)::

    x = x + mixer(norm(x))

- Mamba2 (``M``): layers/mamba2.py's ``Mamba2Mixer``, its conv window and scan state in the
  forward context's slots (runner/recurrent_state.py), as models/qwen35.py's DeltaNet layers;
- attention (``*``): Llama's GQA attention (models/llama.py) with no position encoding, over
  the KV pool's layer ``kv_index`` (only these layers have one: ``ModelConfig.kv_view``);
- MLP (``-``): ``down(relu(up(x)) ** 2)``, no gate (layers/moe.py's ``Relu2Expert``);
- MoE (``E``): layers/moe.py's sparse block with sigmoid routing, the correction bias,
  grouped top-k and routed scaling, squared-ReLU experts and an ungated shared expert.

Modules keep transformers' names (``layers.N.norm``, ``layers.N.mixer.in_proj``, ...) but for
the model's ends (``embed_tokens``, ``norm``, ``lm_head``), q/k/v fused at load, and the MoE
block's own (``mixer.expert_bias``: the router's ``e_score_correction_bias``;
``mixer.shared_expert``: transformers' ``shared_experts``): nemotron_h_config.py and
nemotron_h_gguf.py map a checkpoint's names to them.

The layers run one by one from Python (no native layer call has these mixers); their linears,
norms and the gated Mamba2 norm run the native kernels the checkpoint's format gets. relu(x)
** 2 is exact per element, so a row's value never depends on its place in the batch.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.mamba2 import Mamba2Mixer
from radixserve.layers.moe import Relu2Expert, SparseMoeBlock
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import FULL, LINEAR, ModelConfig
from radixserve.models.llama import Attention, LlamaForCausalLM
from radixserve.recurrent_params import Mamba2Params


class NoRope(nn.Module):
    """Attention without a position encoding: q and k as they are."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class NemotronHBlock(nn.Module):
    """One layer: ``norm`` and the ``mixer`` its type says (module docstring)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        kind = cfg.linear_attn.layer_types[layer_idx]
        self.takes_positions = kind in (LINEAR, FULL)  # the token mixers
        if kind == LINEAR:
            self.mixer = Mamba2Mixer(cfg, layer_idx)
        elif kind == FULL:
            self.mixer = Attention(cfg, cfg.attention_layers.index(layer_idx), NoRope())
        elif cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
            self.mixer = SparseMoeBlock(cfg.hidden_size, cfg.moe)
        else:
            self.mixer = Relu2Expert(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (this block's mixer output, the stream before it); the stream is
        ``x + residual``, added inside the next norm, as in models/llama.py."""
        if residual is None:
            residual, h = x, self.norm(x)
        else:
            h, residual = self.norm(x, residual)
        return (self.mixer(positions, h) if self.takes_positions else self.mixer(h)), residual


class NemotronHForCausalLM(LlamaForCausalLM):
    """Nemotron-H text decoder, dense or MoE; weights under the model's names (module
    docstring), experts one tensor each."""

    # q/k/v only: ``up_proj`` here is a whole matrix, not gate_up's second half
    packed_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv_proj": ("q_proj", "k_proj", "v_proj")}
    # why the layers are not one native call each (models/native_stack.py: plan_kernels)
    layers_in_python: ClassVar[str] = (
        "Nemotron-H's Mamba2, MLP-only and MoE blocks have no native layer call; their "
        "linears still run native kernels")

    def __init__(self, cfg: ModelConfig) -> None:
        nn.Module.__init__(self)
        if not isinstance(cfg.linear_attn, Mamba2Params):
            raise TypeError(f"{cfg.architecture} needs its Mamba2 layout")
        self.config = cfg
        # never applied (NoRope): the engine and the loader set its context and tables
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling, cfg.rotary_dim)
        self.embed_tokens = empty_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # transformers' norm_f
        self.lm_head = (None if cfg.tie_word_embeddings
                        else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))
        self.kernel_plan = None
        self._stack = None
