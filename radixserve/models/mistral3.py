"""Mistral 3 text decoder (Ministral 3, Mistral Small 3.x; models/mistral3_config.py): Mistral's
Llama layers, and for Ministral 3 Llama 4's attention temperature on the queries after rope,
``1 + beta ln(1 + floor(pos / original))`` (transformers' ``get_llama_4_attn_scale``).

The temperature is exactly 1 below position ``original`` (16384 in the releases), so a step
whose positions all lie below it runs the native layer stack where the kernel plan allows (the
same bits as the Python layers); a step reaching past it runs the Python layers, whose rope
applies the temperature (``TemperedRope``).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from radixserve.layers.forward_context import splice_images
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.model_config import ModelConfig
from radixserve.models.llama import LlamaForCausalLM
from radixserve.models.mistral3_config import TEMPERATURE_KEY
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack


class TemperedRope(RotaryEmbedding):
    """Rope, then the queries times Llama 4's temperature (see the module docstring)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                         cfg.rope_scaling, cfg.rotary_dim)
        self.beta = float(cfg.rope_scaling[TEMPERATURE_KEY])
        self.interval = int(cfg.rope_scaling["original_max_position_embeddings"])

    def is_tempered(self, positions: torch.Tensor) -> bool:
        """Whether a position reaches the first interval's end (below it the scale is 1)."""
        return bool(positions.numel()) and int(positions.max()) >= self.interval

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super().forward(positions, q, k)
        if not self.is_tempered(positions):
            return q, k
        # transformers' float32 expression, then the query's dtype
        scale = 1 + self.beta * torch.log(1 + torch.floor(positions / self.interval))
        return q * scale[:, None, None].to(q.dtype), k


class Mistral3ForCausalLM(LlamaForCausalLM):
    """The text model of Mistral 3 checkpoints; weights use Hugging Face names (the vision
    tower's skipped by the family's name map), as in LlamaForCausalLM. Image rows (Pixtral:
    models/vision/pixtral.py) replace the image tokens' embeddings."""

    takes_images: ClassVar[bool] = True

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self._python_stack: PythonLayerStack | None = None
        if cfg.rope_scaling is not None and cfg.rope_scaling.get(TEMPERATURE_KEY):
            self.rotary = TemperedRope(cfg)
            for layer in self.layers:
                layer.self_attn.rotary = self.rotary

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed batch [T] → final hidden states [T, hidden]: the kernel plan's layer stack,
        the Python layers for a step that the temperature scales (module docstring)."""
        if self._stack is None:
            self._stack = NativeLayerStack.build(self)
        self.rotary.check_positions(positions)
        stack = self._stack
        if (isinstance(stack, NativeLayerStack) and isinstance(self.rotary, TemperedRope)
                and self.rotary.is_tempered(positions)):
            if self._python_stack is None:
                self._python_stack = PythonLayerStack(self.layers)
            stack = self._python_stack
        x, residual = stack(positions, splice_images(self.embed_tokens(input_ids)))
        return self.norm(x, residual)[0]
