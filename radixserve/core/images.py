"""A prompt's images as the scheduler sees them: spans of placeholder tokens (torch-free).

An image enters the prompt as ``length`` copies of the model's image token at ``offset``; the
runner replaces those rows' embeddings by the vision encoder's output (runner/image_embeds.py).
The token ids alone cannot tell two images apart, so the prefix cache indexes an image's rows
by ids made from its key instead (`cache_ids`, as SGLang pads them with the image's hash):
ids from ``IMAGE_ID_BASE`` up, past every vocabulary and below the LoRA offset (kv_events.py),
the 31-bit words of the key in turn, so a span's ids carry the whole key.

A model that attends bidirectionally within an image (Gemma 3) needs each image's rows computed
in one step, after everything before it: `fit_chunk` ends a prefill chunk before an image or
after its end, never inside it (a prefix hit may still end inside one: those rows' KV was
computed with the whole image, and the rest of it goes in one chunk).

A model with mRoPE positions (Qwen VL) places an image's rows on its token grid (``grid``
``[t, h, w]``): they take ``max(h, w)`` positions instead of ``length``, so every token after
the image sits ``length - max(h, w)`` positions before its index (`rope_shift`; the runner
places the image rows themselves: runner/mrope_rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

IMAGE_ID_BASE = 1 << 31  # above any vocabulary; + 31 bits stays below LORA_KEY_SHIFT (1 << 32)
_WORDS = 8  # a 32-byte key: eight 31-bit words (one bit of each dropped)


class ImageSpan(Protocol):
    offset: int
    length: int
    key: bytes
    grid: list[int]


def cache_ids(key: bytes, length: int) -> list[int]:
    """The ids the prefix cache indexes an image's ``length`` rows by."""
    words = [IMAGE_ID_BASE + (int.from_bytes(key[4 * i:4 * i + 4], "little") & 0x7FFFFFFF)
             for i in range(_WORDS)]
    return [words[i % _WORDS] for i in range(length)]


def with_image_ids(tokens: list[int], images: list[Any]) -> list[int]:
    """``tokens`` (a prefix of a prompt holding ``images``) with each image's rows replaced
    by its `cache_ids`; ``tokens`` itself when no image falls in it."""
    out = tokens
    for image in images:
        if image.offset >= len(tokens):
            break
        if out is tokens:
            out = list(tokens)
        end = min(image.offset + image.length, len(tokens))
        out[image.offset:end] = cache_ids(image.key, image.length)[:end - image.offset]
    return out


def rope_advance(image: Any) -> int:
    """The positions an image takes in the prompt: ``max(h, w)`` of an mRoPE grid (a still
    image is one frame), else its ``length``."""
    return max(image.grid[1:]) if image.grid else image.length


def rope_shift(images: list[Any], pos: int) -> int:
    """A text token's rope position less its index ``pos`` (<= 0): the images wholly before
    ``pos`` each give back ``length - rope_advance``; 0 without mRoPE grids."""
    return sum(rope_advance(im) - im.length for im in images if im.offset + im.length <= pos)


def overlapping(images: list[Any], start: int, end: int) -> list[Any]:
    """The images with rows among tokens ``start .. end``."""
    return [im for im in images if im.offset < end and start < im.offset + im.length]


def fit_chunk(images: list[Any], start: int, num_new: int, budget: int) -> int:
    """The tokens a chunk from ``start`` may feed, at most ``num_new`` (the request's next
    ``num_new`` tokens fit the step's ``budget``: ``num_new <= budget`` unless cut), so that it
    ends outside every image: before an image it would end inside, or, when it starts inside
    or at one, after that image's end if ``budget`` allows (else 0: it waits for a step with
    room)."""
    end = start + num_new
    for image in images:
        lo, hi = image.offset, image.offset + image.length
        if lo < end < hi:
            if lo > start:
                return lo - start
            return hi - start if hi - start <= budget else 0
    return num_new


@dataclass(slots=True)
class ImageStats:
    """What the image encoder did (metrics)."""

    num_images_encoded: int = 0
    num_encoder_hits: int = 0  # images whose encoder output was kept from an earlier step
    encode_seconds: float = 0.0
    num_image_rows: int = 0  # image-token rows fed (the rest came from the prefix cache)


class NoImages:
    """A text-only model's images (the runner's and the engine's null object): refused."""

    stats = ImageStats()

    def check(self, images: list, num_prompt: int) -> None:
        if images:
            raise ValueError("the served model takes text only: it has no image encoder "
                             "(a vision model's GGUF needs its mmproj file: --mmproj)")

    def positions(self, seqs: list, positions: Any) -> Any:
        return positions

    def step(self, seqs: list, metas: list) -> None:
        return None


NO_IMAGES = NoImages()
