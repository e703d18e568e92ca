"""Images into the forward: the vision encoder's output spliced over the image-token rows.

Each step, the rows of the packed batch that are image tokens (``ScheduledSeq.images``) take
the encoder's embeddings for those positions of their image instead of the token embedding
(the model calls `ForwardContext.images.apply` after its embedding). The encoder's output is
kept per image key, least recently used first, within a memory budget, so a conversation about
one picture encodes it once (and, the image's KV being in the prefix cache, a later turn
usually needs neither). The images of a step that are not kept are encoded in one batch.

A model that attends bidirectionally within an image (Gemma 3) gets its image rows' causal
limit moved to the image's end: the native attention's ``row_len`` (the scheduler has put the
whole rest of the image in this chunk: core/images.py), its window (a sliding layer) still
counted back from its own position (``row_pos``): transformers' mask, AND(window, OR(causal,
the image)).

A model with mRoPE (Qwen VL) also places its rows by position (``rope``: runner/mrope_rows.py):
`positions` gives the rope positions of a step's rows.

`core/images.py`'s `NO_IMAGES` is the null object (a text-only model): any image is refused.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.core.images import ImageStats
from radixserve.core.sched_output import ScheduledSeq
from radixserve.runner.mrope_rows import MRopeRows

logger = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 512 << 20  # the encoder's outputs kept: ~200 Gemma 3 4B images


@dataclass(slots=True)
class ImageSplice:
    """A step's image rows: packed ``rows`` take ``embeds`` ([len(rows), hidden]); with
    ``deepstack`` > 0 (Qwen3-VL) ``embeds`` is [len(rows), hidden * (1 + deepstack)]: the
    input rows, then one block of rows added to the hidden states after each of the first
    ``deepstack`` decoder layers (llama.cpp's layout of the encoder's output)."""

    rows: torch.Tensor
    embeds: torch.Tensor
    deepstack: int = 0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (the step's input embeddings, [T, hidden]) with the image rows replaced."""
        return x.index_copy_(0, self.rows, self.embeds[:, :x.shape[1]].to(x.dtype))

    def after_layer(self, layer: int, x: torch.Tensor) -> None:
        """Add decoder layer ``layer``'s deepstack rows to ``x`` (the layer's output still to
        be added to the residual stream: [T, hidden]) in place; nothing past the last."""
        if layer < self.deepstack:
            width = x.shape[1]
            block = self.embeds[:, width * (layer + 1):width * (layer + 2)]
            x.index_add_(0, self.rows, block.to(x.dtype))


def _image_rows(image, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(the prompt positions among ``lo .. hi`` that take an encoder row, those rows): all of
    them, in order, but where each grid row ends with a break token (``row_breaks``)."""
    span = np.arange(lo, hi)
    k = span - image.offset
    if not image.row_breaks:
        return span, k
    width = image.grid[2]
    keep = k % (width + 1) != width
    return span[keep], (k[keep] // (width + 1)) * width + k[keep] % (width + 1)


class ImageEmbeds:
    """Over ``encoder`` (a models/vision `VisionEncoder`); ``bidirectional``: the pool layers
    (`ForwardContext.layer_metadata` indices) that attend within an image both ways (empty: a
    causal model); ``max_chunk``: the most tokens a step feeds one sequence;
    ``rope``: the model's `MRopeRows` (None: 1-D positions)."""

    def __init__(self, encoder: torch.nn.Module, device: torch.device,
                 bidirectional: frozenset[int],
                 max_chunk: int, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 rope: MRopeRows | None = None) -> None:
        self.encoder = encoder
        self.device = device
        self.bidirectional = bidirectional
        self.max_chunk = max_chunk
        self.rope = rope
        # Qwen3-VL: the encoder's rows carry blocks for the first decoder layers' outputs
        self.deepstack = getattr(encoder, "deepstack_layers", 0)
        self.cache_bytes = cache_bytes
        self.stats = ImageStats()
        self._kept: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._kept_bytes = 0

    def check(self, images: list, num_prompt: int) -> None:
        """ValueError unless ``images`` (messages.ImageInput, prompt order) fit this encoder
        and a prompt of ``num_prompt`` tokens."""
        end = 0
        for i, image in enumerate(images):
            try:
                self._check_one(image)
            except ValueError as exc:
                raise ValueError(f"image {i}: {exc}") from None
            stop = image.offset + image.length
            if image.offset < end or stop > num_prompt:
                raise ValueError(f"image {i}: its tokens {image.offset}..{stop} overlap "
                                 "another image or leave the prompt")
            end = stop

    def _check_one(self, image) -> None:
        tokens = self.encoder.tokens_for(list(image.shape), list(image.grid))
        if len(image.pixels) != 4 * math.prod(image.shape):
            raise ValueError(f"{len(image.pixels)} bytes of pixels for float32 "
                             f"{list(image.shape)}")
        if self.rope is not None and not image.grid:
            raise ValueError("this model places image rows by their grid; the image has none")
        if self.rope is None and image.grid and not image.row_breaks:
            raise ValueError("a grid for a model without mRoPE positions")
        span = tokens + image.grid[1] if image.row_breaks else tokens  # + one break a row
        if image.length != span:
            raise ValueError(f"{image.length} tokens; this model gives the image {span}")
        if len(image.key) != 32:
            raise ValueError("its key must be 32 bytes")
        if self.bidirectional and image.length > self.max_chunk:
            raise ValueError(f"its {image.length} tokens go in one step; "
                             f"--max-num-batched-tokens is {self.max_chunk}")

    def positions(self, seqs: list[ScheduledSeq], positions: np.ndarray) -> np.ndarray:
        """The rope positions of the packed rows of ``seqs`` (their indices ``positions``)."""
        return positions if self.rope is None else self.rope.positions(seqs, positions)

    def step(self, seqs: list[ScheduledSeq], layer_metas: list) -> ImageSplice | None:
        """The splice of ``seqs`` (packed order) this step, None without image rows. Where
        the model attends both ways within an image, the image rows' causal limits move to
        their image's end in the metadata of those layers (``layer_metas``: each pool layer's,
        `ForwardContext.layer_metadata`): in place where only such layers use it, else in a
        copy those layers get (Gemma 4: its sliding layers only)."""
        if not any(s.images for s in seqs):
            return None
        embeds = self._embeddings([im for s in seqs for im in s.images])
        rows, parts, limits = [], [], []
        base = 0
        for seq in seqs:
            start, stop = seq.start_pos, seq.start_pos + seq.num_tokens
            for image in seq.images:
                lo, hi = max(image.offset, start), min(image.offset + image.length, stop)
                span, enc = _image_rows(image, lo, hi)
                rows.append(span - start + base)
                parts.append(embeds[image.key][torch.from_numpy(enc)])
                limits.append(np.full(len(span), image.offset + image.length))
            base += seq.num_tokens
        row_idx = torch.from_numpy(np.concatenate(rows)).to(self.device)
        if self.bidirectional:
            limit = torch.from_numpy(np.concatenate(limits)).to(self.device)
            self._see_whole_images(layer_metas, row_idx, limit)
        self.stats.num_image_rows += len(row_idx)
        return ImageSplice(row_idx, torch.cat(parts), self.deepstack)

    def _see_whole_images(self, layer_metas: list, rows: torch.Tensor,
                          limit: torch.Tensor) -> None:
        both_ways = self.bidirectional
        shared = {id(m) for i, m in enumerate(layer_metas) if i not in both_ways}
        moved: dict[int, object] = {}
        for i in sorted(both_ways):
            meta = layer_metas[i]
            if id(meta) not in moved:
                seen = copy.copy(meta) if id(meta) in shared else meta
                seen.see_whole_images(rows, limit)  # (new tensors: the copy's own)
                moved[id(meta)] = seen
            layer_metas[i] = moved[id(meta)]

    def _embeddings(self, images: list) -> dict[bytes, torch.Tensor]:
        """Each image's encoder output, by key: kept ones, the others encoded now (once)."""
        found: dict[bytes, torch.Tensor] = {}
        todo = {}
        for image in images:
            if image.key in found or image.key in todo:
                continue
            kept = self._kept.get(image.key)
            if kept is not None:
                self._kept.move_to_end(image.key)
                found[image.key] = kept
                self.stats.num_encoder_hits += 1
            else:
                todo[image.key] = image
        if todo:
            found.update(self._encode(list(todo.values())))
        return found

    def _encode(self, images: list) -> dict[bytes, torch.Tensor]:
        """Encode ``images``, one batch per input shape."""
        began = time.perf_counter()
        by_shape: dict[tuple, list] = {}
        for image in images:
            by_shape.setdefault(tuple(image.shape), []).append(image)
        result = {}
        for group in by_shape.values():
            pixels = torch.stack([
                torch.from_numpy(np.frombuffer(im.pixels, np.float32).reshape(im.shape).copy())
                for im in group]).to(self.device)
            for image, emb in zip(group, self.encoder(pixels)):
                result[image.key] = emb
                self._keep(image.key, emb)
        elapsed = time.perf_counter() - began
        self.stats.num_images_encoded += len(images)
        self.stats.encode_seconds += elapsed
        logger.debug("vision encoder: %d image(s) in %.2f s", len(images), elapsed)
        return result

    def _keep(self, key: bytes, emb: torch.Tensor) -> None:
        size = emb.numel() * emb.element_size()
        if size > self.cache_bytes:
            return
        self._kept[key] = emb
        self._kept_bytes += size
        while self._kept_bytes > self.cache_bytes:
            _, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.numel() * old.element_size()
