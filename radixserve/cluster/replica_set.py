"""ReplicaSet: the data-parallel engine replicas, each started, watched and replaced by its own
`EngineSupervisor` on its own sockets, behind one `DataParallelClient`.

A replica that dies fails its own requests (its client's ``mark_dead``), the router forgets
its prefix index and skips it while it restarts; the others serve on. One that cannot be
restarted (attempts used up, or restarts off) ends the server, as a lone engine would.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from radixserve.cluster.dp_client import DataParallelClient
from radixserve.cluster.routing import RoutingConfig, make_router
from radixserve.frontend.core_client import EngineCoreClient
from radixserve.messages import EngineReady
from radixserve.cluster.engine_launcher import LocalLauncher
from radixserve.cluster.engine_supervisor import EngineSupervisor, RestartPolicy
from radixserve.cluster.runtime_loras import RuntimeLoras


class ReplicaSet:
    """``builds[i]`` is what replica i's process builds (picklable); ``folder`` holds one
    sub-folder of ipc sockets per replica; ``launchers[i]`` starts replica i's engines
    (default: local child processes; `ray_executor`'s for Ray actors)."""

    def __init__(self, builds: list, folder: str, startup_timeout: float,
                 policy: RestartPolicy, routing: RoutingConfig,
                 launchers: list | None = None) -> None:
        self.routing = routing
        self.loras = RuntimeLoras()  # what every replica's engine should hold
        self.supervisors: list[EngineSupervisor] = []
        launchers = launchers or [LocalLauncher()] * len(builds)
        for i, (build, launcher) in enumerate(zip(builds, launchers, strict=True)):
            sub = os.path.join(folder, f"r{i}")
            os.makedirs(sub, exist_ok=True)
            client = EngineCoreClient(*launcher.addresses(sub, 0))
            label = f"replica {i}: " if len(builds) > 1 else ""
            self.supervisors.append(EngineSupervisor(client, build, sub, startup_timeout,
                                                     policy, label=label, launcher=launcher,
                                                     loras=self.loras))
        self.client: DataParallelClient | None = None

    async def start(self) -> EngineReady:
        """Start every replica at once; RuntimeError (naming the replica) if any fails."""
        results = await asyncio.gather(*(s.start() for s in self.supervisors),
                                       return_exceptions=True)
        for i, (sup, result) in enumerate(zip(self.supervisors, results)):
            if isinstance(result, BaseException):
                for other, r in zip(self.supervisors, results):
                    if isinstance(r, BaseException):
                        other.client.mark_dead(str(r))  # close() sends it no Shutdown
                where = f"replica {i}: " if len(self.supervisors) > 1 else ""
                raise RuntimeError(f"{where}{result}")
        ready = results[0]
        router = make_router(self.routing, ready.block_size,
                             [r.num_kv_blocks for r in results])
        self.client = DataParallelClient([s.client for s in self.supervisors], router,
                                         self.loras)
        self.client.pids = lambda: [s.pid for s in self.supervisors]
        return EngineReady(min(r.max_model_len for r in results), ready.vocab_size,
                           sum(r.num_kv_blocks for r in results), ready.block_size,
                           takes_images=all(r.takes_images for r in results))

    def watch(self, on_fatal: Callable[[str], None],
              on_restart: Callable[[], None] = lambda: None) -> None:
        """Replace dead replicas from now on (``on_restart`` before each new start)."""
        for i, sup in enumerate(self.supervisors):
            sup.watch(on_fatal, self._restarter(i, on_restart))

    def _restarter(self, i: int, on_restart) -> Callable[[], None]:
        def restarted() -> None:
            self.client.router.forget(i)
            on_restart()
        return restarted

    @property
    def num_restarts(self) -> list[int]:
        return [s.num_restarts for s in self.supervisors]

    async def close(self, timeout: float = 10.0) -> None:
        """Shut every replica down (each killed if it does not exit in time)."""
        await asyncio.gather(*(s.close(timeout=timeout) for s in self.supervisors))
