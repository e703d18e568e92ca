"""Memory accounting before a model loads: what it will take, and what there is.

The estimate is deliberately simple: the weights' file size (GGUF and safetensors are loaded as
stored, mmap'ed: about the file) plus the KV pool's budget (``--kv-cache-memory-gb`` per
replica) plus a fixed allowance for an engine process's own runtime. What there is:
``--models-memory-gb`` minus the estimates of the models already loaded, when given (also how
tests force a refusal); else the system's ``MemAvailable`` (which already counts the loaded
models' processes)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from radixserve.frontend.models_dir.catalog import ModelEntry
from radixserve.cpu.memory import mem_available, trim_heap

GIB = 1 << 30
ENGINE_OVERHEAD_BYTES = 300 << 20  # an engine process's interpreter, torch and buffers


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    kv_bytes: int  # one replica's KV pool
    num_replicas: int = 1
    budget_bytes: int | None = None  # --models-memory-gb; None: the system's MemAvailable

    def estimate(self, entry: ModelEntry) -> int:
        """Bytes ``entry`` is expected to take once loaded (every replica holds its own
        copy of the weights and pool)."""
        return self.num_replicas * (entry.size_bytes + self.kv_bytes + ENGINE_OVERHEAD_BYTES)

    def available(self, loaded_estimates: int) -> int:
        """Bytes a new model may take now, given the estimates of those loaded."""
        if self.budget_bytes is not None:
            return self.budget_bytes - loaded_estimates
        return mem_available()


def reclaim() -> None:
    """Give back what an unloaded model held in this (API) process. Its tokenizer tables,
    engine client and request state sit in reference cycles, and the server's collector
    thresholds (`serve.settle_gc`) leave those to a full collection that may come only after
    several loads (measured: +300 MB and a pipe per Gemma-3 load); collect them now, then
    hand the freed heap back to the system (glibc's ``malloc_trim``), or RSS stays at its
    peak."""
    gc.collect()
    trim_heap()


def gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
