"""Attention backends by name, imported lazily."""

from __future__ import annotations

import importlib

_BACKENDS = {
    "torch": ("radixserve.layers.attn_backends.torch_paged", "TorchPagedAttention"),
}


def get_attn_backend(name: str):
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; supported: {sorted(_BACKENDS)}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
