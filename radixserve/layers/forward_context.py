"""The forward context: per-step attention metadata and the KV pool, visible to attention layers.

Models keep a plain ``forward(input_ids, positions)``; attention layers read the context set by
``with forward_context(ctx):`` around the forward. No nesting; always reset in ``finally``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class ForwardContext:
    """``attn_metadata``: the first KV group's; ``layer_metadata[i]``: layer i's (its group's
    block table, core/kv/kv_groups.py; every entry is ``attn_metadata`` with one group)."""

    attn_metadata: Any
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    backend: Any
    layer_metadata: list[Any]


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
