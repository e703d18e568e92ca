"""Vision encoders (engine process, torch): images' pixels → the text model's embeddings.

The engine needs only `VisionEncoder`: ``forward(pixels [n, *shape] float32)`` →
[n, tokens, text hidden] float32, the rows that replace an image's placeholder tokens, for
``n`` images of one input shape; ``tokens_for`` says which shapes it takes and how many rows
each gives (one fixed shape for Gemma 3 and SmolVLM's tiles, a grid of patches for Qwen VL). models/vision/load.py finds and builds one (``find_mmproj``,
``load_vision_encoder``); a family adds a module (Gemma 3: gemma3.py on siglip.py) and an entry
in load.py's tables.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixserve.models.vision.fixed_shape import FixedShape
from radixserve.models.vision.load import find_mmproj, load_vision_encoder


class VisionEncoder(Protocol):
    hidden_size: int  # the text model's width its rows have
    # Qwen3-VL: each row also carries one block of hidden_size for each of the first
    # ``deepstack_layers`` decoder layers' outputs (rows [tokens, hidden * (1 + k)]); 0 others
    deepstack_layers: int

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        """The rows an image of input ``shape`` (the processor's pixels) and token ``grid``
        (`messages.ImageInput.grid`: ``[t, h, w]`` for a model with mRoPE positions, ``[]``
        otherwise) gives; ValueError for one this encoder cannot take."""
        ...

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor: ...

    def describe(self) -> str:
        """One line for the load's log: the shape and how the matrices are held."""
        ...


__all__ = ["FixedShape", "VisionEncoder", "find_mmproj", "load_vision_encoder"]
