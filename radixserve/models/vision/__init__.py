"""Vision encoders (engine process, torch): images' pixels → the text model's embeddings.

The engine needs only `VisionEncoder`: ``forward(pixels [n, *image_shape] float32)`` →
[n, tokens_per_image, text hidden] float32, the rows that replace an image's placeholder
tokens. models/vision/load.py finds and builds one (``find_mmproj``,
``load_vision_encoder``); a family adds a module (Gemma 3: gemma3.py on siglip.py) and an entry
in load.py's tables.
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixserve.models.vision.load import find_mmproj, load_vision_encoder


class VisionEncoder(Protocol):
    tokens_per_image: int  # the placeholder tokens one image takes
    image_shape: list[int]  # [C, H, W] of the processor's output

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor: ...

    def describe(self) -> str:
        """One line for the load's log: the shape and how the matrices are held."""
        ...


__all__ = ["VisionEncoder", "find_mmproj", "load_vision_encoder"]
