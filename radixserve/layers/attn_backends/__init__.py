"""Attention backends by name, imported lazily; ``auto`` picks the fastest one that runs here."""

from __future__ import annotations

import importlib

import torch

_BACKENDS = {
    "torch": ("radixserve.layers.attn_backends.torch_paged", "TorchPagedAttention"),
    "cpu_native": ("radixserve.layers.attn_backends.cpu_native", "NativeCpuPagedAttention"),
}


def resolve_attn_backend(name: str, device: torch.device, dtype: torch.dtype,
                         kv_dtype: torch.dtype | None = None) -> str:
    """``auto`` → ``cpu_native`` for a float32 model on a CPU where the native kernels load
    (its pool of float32, float16, bfloat16 or int8: ``kv_dtype``, default ``dtype``), else
    ``torch``; other names are returned as given."""
    if name != "auto":
        return name
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if (device.type == "cpu" and dtype == torch.float32
            and kv_dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8)):
        from radixserve.kernels import native

        if native.load() is not None:
            return "cpu_native"
    return "torch"


def get_attn_backend(name: str):
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; supported: {sorted(_BACKENDS)}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
