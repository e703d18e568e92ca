"""SmolLM3 decoder: Llama layers, and no rotary position embedding on its NoPE layers (every
fourth one in the released models; ``ModelConfig.layer_rope.no_rope``).

A NoPE layer's rotary is models/layer_rope.py's ``NoRope``, whose tables rotate by nothing, so
the layers keep one native call each where the kernel plan allows (models/native_stack.py).
"""

from __future__ import annotations

from radixserve.model_config import ModelConfig
from radixserve.models.layer_rope import layer_rotaries
from radixserve.models.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3 (text); weights use Hugging Face names, as in LlamaForCausalLM."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.rotary, per_layer = layer_rotaries(cfg)
        for layer, rotary in zip(self.layers, per_layer):
            layer.self_attn.rotary = rotary
