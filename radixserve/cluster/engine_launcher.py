"""Where an engine core runs: a launcher starts one on given sockets, a handle watches it.

    launcher.addresses(folder, generation) → (input_addr, output_addr)   for the client to bind
    await launcher.start(build, input_addr, output_addr) → handle          the engine connects
    handle.pid · handle.is_alive() · await handle.exited() → why · await handle.stop(grace_s)

`LocalLauncher` (``--distributed-executor-backend mp``, the default) spawns a child process on
ipc:// sockets in ``folder``; `radixserve.cluster.ray_executor` has the Ray actor one on
tcp:// sockets. Both run the same ``run_engine_core`` loop, so the client (`EngineCoreClient`)
and the supervisor (`EngineSupervisor`) do not know which it is.
"""

from __future__ import annotations

import asyncio
import multiprocessing

from radixserve.cluster.engine_prestart import PrestartedEngine
from radixserve.engine.core_proc import run_engine_core


class LocalLauncher:
    """Engine cores as child processes of the API process (spawned: a fresh interpreter);
    ``prestarted``: a process spawned ahead (`engine_prestart`), which the first start takes
    instead of spawning one."""

    def __init__(self, prestarted: PrestartedEngine | None = None) -> None:
        self.prestarted = prestarted

    def addresses(self, folder: str, generation: int) -> tuple[str, str]:
        """ipc sockets in ``folder``; generation 0 is the first engine, then one per restart
        (a dead engine's sockets may still hold its messages)."""
        suffix = f"-{generation}" if generation else ""
        return f"ipc://{folder}/in{suffix}", f"ipc://{folder}/out{suffix}"

    async def start(self, build, input_addr: str, output_addr: str) -> LocalProcess:
        prestarted, self.prestarted = self.prestarted, None
        proc = prestarted and prestarted.take(build, input_addr, output_addr)
        if proc is None:  # none ahead, or it died: a fresh one
            proc = multiprocessing.get_context("spawn").Process(
                target=run_engine_core, args=(build, input_addr, output_addr),
                name="radixserve-engine", daemon=True)
            proc.start()
        return LocalProcess(proc)


class LocalProcess:
    """One engine child process. Its death is noticed through the process sentinel (no
    polling delay)."""

    def __init__(self, proc: multiprocessing.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    async def exited(self) -> str:
        """Return once the process has exited (reaped), saying how."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_reader(self.proc.sentinel, lambda: done.done() or done.set_result(None))
        try:
            if self.proc.is_alive():
                await done
        finally:
            loop.remove_reader(self.proc.sentinel)
        self.proc.join()
        return f"the engine process exited with code {self.proc.exitcode}"

    async def stop(self, grace_s: float = 1.0) -> None:
        """Wait up to ``grace_s`` for it to exit (after a Shutdown), then kill it; reaped."""
        self.proc.join(timeout=grace_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
