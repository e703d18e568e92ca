"""What every image processor gives the API process: pixels, how many prompt tokens, a key.

An `ImageProcessor` turns one decoded image into the model's input tensor (numpy, float32,
channels first) and says what text stands for the image in the prompt. The chat template writes
``placeholder`` once per image; `expand` gives the text that replaces it, whose tokens hold
``num_tokens`` consecutive ``image_token_id``s (the rows the vision encoder fills). Processors
are torch-free: they run in the API process.

A family that cuts an image into several encoder inputs (SmolVLM's tiles) is a
`TilingImageProcessor`: ``process_tiles`` gives the tiles and the text for the whole image at
once, each tile its own run of image tokens in that text (one `messages.ImageInput` per tile).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

__all__ = ["ImageProcessor", "ImageTiles", "ProcessedImage", "TilingImageProcessor",
           "image_key", "special_token_id"]


def image_key(name: str, pixels: np.ndarray) -> bytes:
    """32 bytes naming an image as its encoder sees it: sha256 over the processor's name, the
    pixels' shape and their bytes (C order). Equal pixels from one processor, equal keys."""
    digest = hashlib.sha256(name.encode())
    digest.update(np.asarray(pixels.shape, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(pixels).data)
    return digest.digest()


def special_token_id(tokenizer, token: str) -> int:
    """The id of ``token`` (a radixserve `Tokenizer`'s vocabulary), which must be one token
    that a rendered prompt spelling it tokenizes to; ValueError otherwise."""
    ids = tokenizer.encode_prompt(token)
    if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids) != [token]:
        raise ValueError(f"the tokenizer has no {token} special token (the text tokenizes to "
                         f"{len(ids)} tokens)")
    return ids[0]


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """One image, ready for the encoder: ``pixels`` float32, C order (Gemma 3: [3, H, W]);
    ``num_tokens``: the image tokens `ImageProcessor.expand` writes for it; ``key``: `image_key`;
    ``grid``: the token grid ``(t, h, w)`` of a model with mRoPE positions (Qwen VL;
    ``t * h * w == num_tokens``), ``()`` for the others (`messages.ImageInput.grid`);
    ``row_breaks``: the text writes one other token after each grid row (Pixtral's
    [IMG_BREAK] / [IMG_END]; `messages.ImageInput.row_breaks`)."""

    pixels: np.ndarray
    num_tokens: int
    key: bytes
    grid: tuple[int, ...] = ()
    row_breaks: bool = False

    @classmethod
    def of(cls, name: str, pixels: np.ndarray, num_tokens: int,
           grid: tuple[int, ...] = (), row_breaks: bool = False) -> ProcessedImage:
        pixels = np.ascontiguousarray(pixels, dtype=np.float32)
        return cls(pixels, num_tokens, image_key(name, pixels), tuple(grid), row_breaks)


class ImageProcessor(Protocol):
    """A model family's preprocessing (one file per family under radixserve/multimodal/).

    Implementations are immutable and safe to call from several threads at once.
    """

    name: str  # goes into every key: two processors never share keys
    placeholder: str  # the text the chat template writes for one image
    image_token_id: int  # the token each encoder output row replaces

    def process(self, image: Image.Image, detail: str | None = None) -> ProcessedImage:
        """The encoder's input for ``image`` (any Pillow mode; not mutated). ``detail``: the
        OpenAI hint ("auto", "low", "high"); a processor with one fixed resolution ignores it.
        ValueError for an image it cannot convert."""
        ...

    def expand(self, p: ProcessedImage) -> str:
        """The prompt text replacing one ``placeholder``: tokenized, it holds exactly
        ``p.num_tokens`` consecutive ``image_token_id``s and no others."""
        ...


@dataclass(frozen=True, slots=True)
class ImageTiles:
    """One image cut into encoder inputs: ``tiles`` in prompt order; ``text`` replaces the
    image's placeholder and, tokenized, holds one run of ``tiles[i].num_tokens`` image tokens
    per tile, in the same order, separated by other tokens."""

    tiles: tuple[ProcessedImage, ...]
    text: str


class TilingImageProcessor(Protocol):
    """A family whose image is several encoder inputs of one fixed shape (SmolVLM's tiles).

    Implementations are immutable and safe to call from several threads at once.
    """

    name: str
    placeholder: str
    image_token_id: int

    def process_tiles(self, image: Image.Image, detail: str | None = None) -> ImageTiles:
        """``image``'s tiles and prompt text (`ImageTiles`); ``image`` is not mutated.
        ValueError for an image it cannot convert."""
        ...
