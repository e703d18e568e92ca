"""A rendered prompt's image placeholders → the prompt's token ids and its `ImageInput`s.

The chat template (or a caller's own prompt text) writes the processor's ``placeholder`` once
per image; each, in order, becomes the processor's expansion (Gemma 3: ``<start_of_image>`` +
256 image tokens + ``<end_of_image>``), as transformers' processors do before tokenizing. The
prompt is then tokenized as every prompt is, and each image's run of image tokens gives its
span::

    ids: [ ...text... | boi | img img ... img | eoi | ...text... | boi | img ... img | eoi ]
                             ^offset, length = num_tokens ^
A `TilingImageProcessor` (SmolVLM) writes several runs for one image, one per tile, and each
tile becomes its own `ImageInput`. Pixtral (Mistral 3) writes a run per grid row, each followed
by one break token: the rows and their breaks are one span (`ImageInput.row_breaks`). Torch-free (the API process, and the offline `LLM`).
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
    runs = _runs(ids, processor.image_token_id)
    spans = _spans(runs, processed)
    if spans is None:
        raise ValueError(f"the prompt holds {len(runs)} runs of image tokens for "
                         f"{len(images)} images (is the image token typed in the text?)")
    return prompt, ids, [
        ImageInput(offset=offset, length=length, key=p.key, pixels=p.pixels.tobytes(),
                   shape=list(p.pixels.shape), grid=list(p.grid), row_breaks=p.row_breaks)
        for (offset, length), p in zip(spans, processed)]


def _spans(runs: list[tuple[int, int]],
           processed: list) -> list[tuple[int, int]] | None:
    """(offset, length) of each processed image's span in the prompt, None where the runs of
    image tokens do not fit them: one run each, or, for an image with ``row_breaks``, one run
    of ``w`` a grid row, each followed by one other token (its span takes that token too)."""
    spans, i = [], 0
    for p in processed:
        rows, width = (p.grid[1], p.grid[2]) if p.row_breaks else (1, p.num_tokens)
        mine = runs[i:i + rows]
        if len(mine) != rows or any(n != width for _, n in mine) or any(
                b[0] != a[0] + width + 1 for a, b in zip(mine, mine[1:])):
            return None
        spans.append((mine[0][0], rows * (width + 1) if p.row_breaks else width))
        i += rows
    return spans if i == len(runs) else None


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
