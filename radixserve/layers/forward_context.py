"""The forward context: per-step attention metadata and the KV pool, visible to attention layers.

Models keep a plain ``forward(input_ids, positions)``; attention layers read the context set by
``with forward_context(ctx):`` around the forward. No nesting; always reset in ``finally``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


class NoLoraBatch:
    """The step has no LoRA adapter row (the null `layers.lora.LoraBatch`): nothing is added
    and the model's own layer stack runs."""

    def apply(self, key: tuple[int, str], x: torch.Tensor, y: torch.Tensor) -> None:
        return None

    def stack(self, plain, python):
        return plain


NO_LORA = NoLoraBatch()


@dataclass(slots=True)
class ForwardContext:
    """``attn_metadata``: the first KV group's; ``layer_metadata[i]``: layer i's (its group's
    block table, core/kv/kv_groups.py; every entry is ``attn_metadata`` with one group). ``lora``: the step's `LoraBatch` (`NO_LORA`: no
    adapter row)."""

    attn_metadata: Any
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    backend: Any
    layer_metadata: list[Any]
    lora: Any = NO_LORA  # the step's per-row LoRA adapters (layers/lora.py)
    states: Any = None  # a hybrid model's recurrent states (runner/recurrent_state.py)
    images: Any = None  # the step's image rows (runner/image_embeds.py `ImageSplice`), or None


_current: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext):
    global _current
    assert _current is None, "forward contexts do not nest"
    _current = ctx
    try:
        yield ctx
    finally:
        _current = None


def get_forward_context() -> ForwardContext:
    assert _current is not None, "attention called outside forward_context()"
    return _current


def splice_images(x: torch.Tensor) -> torch.Tensor:
    """A vision model's input embeddings ``x`` [T, hidden] with the step's image rows taken
    from the image encoder (runner/image_embeds.py); ``x`` as it is on a text-only step."""
    images = get_forward_context().images
    return x if images is None else images.apply(x)


def image_rows() -> torch.Tensor | None:
    """The step's image rows (packed indices), None on a text-only step."""
    images = get_forward_context().images
    return None if images is None else images.rows


def deepstack_hook():
    """``after_layer(i, x)`` of a step whose image rows add to the first layers' outputs
    (Qwen3-VL's deepstack: runner/image_embeds.py `ImageSplice`), else None."""
    images = get_forward_context().images
    return images.after_layer if images is not None and images.deepstack else None
