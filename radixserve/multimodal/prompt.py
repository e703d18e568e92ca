"""A rendered prompt's image placeholders → the prompt's token ids and its `ImageInput`s.

The chat template (or a caller's own prompt text) writes the processor's ``placeholder`` once
per image; each, in order, becomes the processor's expansion (Gemma 3: ``<start_of_image>`` +
256 image tokens + ``<end_of_image>``), as transformers' processors do before tokenizing. The
prompt is then tokenized as every prompt is, and each image's run of image tokens gives its
span::

    ids: [ ...text... | boi | img img ... img | eoi | ...text... | boi | img ... img | eoi ]
                             ^offset, length = num_tokens ^
A `TilingImageProcessor` (SmolVLM) writes several runs for one image, one per tile, and each
tile becomes its own `ImageInput`. Torch-free (the API process, and the offline `LLM`).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from radixserve.messages import ImageInput
from radixserve.multimodal.processor import ImageProcessor, ImageTiles, TilingImageProcessor

__all__ = ["place_images"]


def place_images(text: str, images: list[Image.Image], details: list[str | None],
                 processor: ImageProcessor | TilingImageProcessor,
                 encode) -> tuple[str, list[int], list[ImageInput]]:
    """(the expanded prompt text, its token ids, one `ImageInput` per image in prompt order;
    per tile, in prompt order, for a `TilingImageProcessor`).

    ``text`` holds ``processor.placeholder`` once per image of ``images`` (``details``: each
    one's OpenAI ``detail``, or None); ``encode``: the served tokenizer's prompt encoding.
    CPU-heavy (resize, hashing): call it off the event loop. ValueError when the text holds
    another number of placeholders (typed in the text, or a template that leaves images out)
    or the tokens another number of runs of image tokens (the image token typed in the text).
    """
    pieces = text.split(processor.placeholder)
    if len(pieces) != len(images) + 1:
        raise ValueError(f"the prompt holds {processor.placeholder} {len(pieces) - 1} times "
                         f"for {len(images)} images (is it typed in the text, or does the "
                         f"chat template leave images out?)")
    cut = [_tiles(processor, image, detail) for image, detail in zip(images, details)]
    prompt = pieces[0] + "".join(c.text + piece for c, piece in zip(cut, pieces[1:]))
    processed = [tile for c in cut for tile in c.tiles]
    ids = encode(prompt)
    spans = _runs(ids, processor.image_token_id)
    if [length for _, length in spans] != [p.num_tokens for p in processed]:
        raise ValueError(f"the prompt holds {len(spans)} runs of image tokens for "
                         f"{len(images)} images (is the image token typed in the text?)")
    return prompt, ids, [
        ImageInput(offset=offset, length=length, key=p.key, pixels=p.pixels.tobytes(),
                   shape=list(p.pixels.shape), grid=list(p.grid))
        for (offset, length), p in zip(spans, processed)]


def _tiles(processor: ImageProcessor | TilingImageProcessor, image: Image.Image,
           detail: str | None) -> ImageTiles:
    """``image`` as encoder inputs and prompt text: a one-input processor's as one tile."""
    if hasattr(processor, "process_tiles"):
        return processor.process_tiles(image, detail)
    p = processor.process(image, detail)
    return ImageTiles((p,), processor.expand(p))


def _runs(ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``token_id`` in ``ids``, in order."""
    is_token = np.concatenate(([0], np.asarray(ids) == token_id, [0])).astype(np.int8)
    edges = np.flatnonzero(np.diff(is_token))
    starts, ends = edges[0::2], edges[1::2]
    return list(zip(starts.tolist(), (ends - starts).tolist()))
