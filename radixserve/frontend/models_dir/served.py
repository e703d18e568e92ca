"""One loaded model of the hub: its engine processes (a `ReplicaSet`, supervised and restarted
as in single-model ``serve``), its `AsyncLLM`, `ServingContext` and the ASGI app `build_app`
makes of them. The hub forwards requests to ``router`` in-process (no extra HTTP hop).
`radixserve.serve_models_dir.start_served_model` starts one."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field

from radixserve.frontend.models_dir.catalog import ModelEntry


@dataclass(eq=False)
class ServedModel:
    """A started model. ``router`` is its app's `Router` (the hub's guard is in front of it,
    so it has none of its own); the hub's `Slot` counts the requests forwarded to it."""

    entry: ModelEntry
    supervisor: object  # ReplicaSet
    ctx: object  # ServingContext
    metrics: object  # ServerMetrics
    router: object  # http.router.Router
    estimate_bytes: int
    folder: str | None = None  # its engines' ipc sockets (removed by `close`)
    loaded_at: float = field(default_factory=time.time)

    @property
    def max_model_len(self) -> int:
        return self.ctx.max_model_len

    async def close(self, timeout: float = 10.0) -> None:
        """Shut its engines down (killed if they do not exit within ``timeout``), end the
        requests still open on it (each in its API's way: an error event, an Ollama error
        line) and remove its socket folder."""
        try:
            await self.supervisor.close(timeout=timeout)
        finally:
            # NOTE: an engine told to shut down sends nothing more, so a request still waiting
            # on it would wait forever (and keep this model's objects alive): fail it now.
            for replica in self.supervisor.supervisors:
                replica.client.mark_dead(f"model '{self.entry.name}' was unloaded")
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
