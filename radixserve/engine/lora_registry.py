"""The engine's LoRA adapters: names → ids and paths, and which are resident in the runner.

Each load gets a fresh id (never reused: a reloaded name is a new adapter, so no prefix-cache
page computed with the old weights can match it, core/kv/kv_manager.py). ``max_loras`` caps the
adapters resident in the runner (their weights in memory): loading or using one more evicts
the least recently used resident adapter that no unfinished request uses; its name stays
registered and its weights are read again from its path when a request names it. When every
resident adapter is in use the cap is exceeded for a while (a warning), never a request
refused. Called on the engine's single thread, between steps.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class LoraNotFound(ValueError):
    """An adapter name that is not loaded (HTTP 404)."""


@dataclass(frozen=True)
class LoraEntry:
    lora_id: int
    path: str


class LoraRegistry:
    def __init__(self, runner, max_loras: int = 4,
                 in_use: Callable[[], set] = set) -> None:
        """``runner``: has ``add_lora(id, path)`` / ``remove_lora(id)``; ``in_use``: the
        adapter ids unfinished requests hold."""
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        self.runner = runner
        self.max_loras = max_loras
        self.in_use = in_use
        self.entries: dict[str, LoraEntry] = {}
        self._resident: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._ids = itertools.count(1)

    @property
    def names(self) -> list[str]:
        return sorted(self.entries)

    def load(self, name: str, path: str) -> int:
        """Register ``path`` as ``name`` and make it resident; ValueError when the name is
        taken or the adapter does not fit the model (nothing registered then)."""
        if not name or name in self.entries:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded" if name
                             else "the LoRA adapter needs a name")
        if not hasattr(self.runner, "add_lora"):
            raise ValueError("LoRA adapters need a single-rank engine (no tensor parallel)")
        lora_id = next(self._ids)
        self.runner.add_lora(lora_id, path)
        self.entries[name] = LoraEntry(lora_id, path)
        self._resident[lora_id] = None
        self._evict_over_cap(keep=lora_id)
        logger.info("LoRA adapter %r loaded from %s (id %d)", name, path, lora_id)
        return lora_id

    def unload(self, name: str) -> None:
        """Forget ``name``; LoraNotFound if unknown, ValueError while requests use it."""
        entry = self._entry(name)
        if entry.lora_id in self.in_use():
            raise ValueError(f"the LoRA adapter {name!r} is used by unfinished requests")
        del self.entries[name]
        if self._resident.pop(entry.lora_id, 0) is None:
            self.runner.remove_lora(entry.lora_id)

    def acquire(self, name: str) -> int:
        """The id of ``name`` for a new request, made resident (read again from its path if
        it was evicted) and most recently used. LoraNotFound if unknown."""
        entry = self._entry(name)
        if entry.lora_id in self._resident:
            self._resident.move_to_end(entry.lora_id)
        else:
            self.runner.add_lora(entry.lora_id, entry.path)
            self._resident[entry.lora_id] = None
            self._evict_over_cap(keep=entry.lora_id)
        return entry.lora_id

    def check(self, name: str) -> None:
        """LoraNotFound unless ``name`` is loaded (no side effect)."""
        self._entry(name)

    def _entry(self, name: str) -> LoraEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise LoraNotFound(f"no LoRA adapter named {name!r}; loaded: {self.names}")
        return entry

    def _evict_over_cap(self, keep: int | None = None) -> None:
        if len(self._resident) <= self.max_loras:
            return
        busy = self.in_use()
        for lora_id in list(self._resident):
            if len(self._resident) <= self.max_loras:
                return
            if lora_id not in busy and lora_id != keep:
                del self._resident[lora_id]
                self.runner.remove_lora(lora_id)
        logger.warning("LoRA: %d adapters resident, over --max-loras %d: all are in use",
                       len(self._resident), self.max_loras)
