"""`VisionEncoder.tokens_for` (models/vision/__init__.py) of an encoder with one input shape."""

from __future__ import annotations


class FixedShape:
    """`VisionEncoder.tokens_for` of an encoder whose every input has one shape
    (``image_shape``) and gives ``tokens_per_image`` rows (Gemma 3's images, SmolVLM's tiles)."""

    image_shape: list[int]
    tokens_per_image: int
    deepstack_layers = 0  # `VisionEncoder`: no rows beside the main ones (Qwen3-VL has some)

    def tokens_for(self, shape: list[int], grid: list[int]) -> int:
        if list(shape) != list(self.image_shape) or grid:
            got = f"{list(shape)} (grid {list(grid)})" if grid else f"{list(shape)}"
            raise ValueError(f"pixels of shape {got}; this model's encoder takes float32 "
                             f"{list(self.image_shape)}")
        return self.tokens_per_image
