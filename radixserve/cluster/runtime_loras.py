"""RuntimeLoras: the LoRA adapters the engines should hold, kept in the API process so that an
engine started to replace a dead one serves what ``/v1/models`` lists.

    first EngineReady.loras ──▶ wanted (name → path) ◀── /v1/load_lora_adapter, /v1/unload_…
                                     │ a new engine is ready, holding ready.loras (its --lora)
                                     ▼
         calls_for(ready.loras): unload what it holds that is not wanted (an adapter given at
         start and unloaded since), then load what is wanted that it lacks (loaded at run time)

An adapter a new engine can no longer load (its files changed or went away since) is forgotten:
each ``on_forgotten`` callback is told its name (the API's routing table drops it, the other
replicas unload it). One object is shared by a `ReplicaSet`'s supervisors and its
`DataParallelClient`; it is only touched on the API process's event loop.
"""

from __future__ import annotations

from collections.abc import Callable


class RuntimeLoras:
    def __init__(self) -> None:
        self.wanted: dict[str, str] | None = None  # None until the first engine is ready
        self.on_forgotten: list[Callable[[str], None]] = []

    def calls_for(self, held: dict[str, str]) -> list[tuple[str, str | None]]:
        """The (name, path or None to unload) calls that bring a freshly started engine holding
        ``held`` to the wanted set, unloads first; none for the first engine, whose adapters
        become the wanted set (mutates it then)."""
        if self.wanted is None:
            self.wanted = dict(held)
            return []
        unloads = [(name, None) for name, path in held.items()
                   if self.wanted.get(name) != path]
        loads = [(name, path) for name, path in self.wanted.items() if held.get(name) != path]
        return unloads + loads

    def loaded(self, name: str, path: str) -> None:
        """Every live engine has loaded ``path`` as ``name``."""
        self._ensure_started()[name] = path

    def unloaded(self, name: str) -> None:
        self._ensure_started().pop(name, None)

    def forget(self, name: str) -> None:
        """A new engine could not load ``name`` again: no longer wanted, and each callback told.
        A name not wanted (forgotten already by another replica) is ignored."""
        if self._ensure_started().pop(name, None) is None:
            return
        for callback in self.on_forgotten:
            callback(name)

    def _ensure_started(self) -> dict[str, str]:
        if self.wanted is None:  # a load before any engine said what it holds: none
            self.wanted = {}
        return self.wanted
