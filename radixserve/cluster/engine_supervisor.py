"""EngineSupervisor: the API process's engine-core process, started, watched and replaced.

    start() ──▶ engine up ──(its process exits: kill -9, a crash)──▶ client.mark_dead()
                  ▲    │                                               ▲ │ in-flight requests
                  │    └─(hung: silent with work in flight)─▶ SIGKILL ─┘ │ fail at once; /health
                  └── ready ◀── spawn on fresh sockets ◀── back-off ◀────┘ 503 until ready again
                                      │ start failed: next attempt
                                      ▼ restarts disabled, or attempts used up
                               on_fatal(reason): the API process exits non-zero

Where the engine runs is its launcher's business (`engine_launcher`: a child process by default,
a Ray actor with ``--distributed-executor-backend ray``); deaths are noticed through its handle
(a process sentinel, an actor's task ending) with no polling delay. Consecutive failures
(a start that failed, or an engine that died within ``stable_after_s`` of starting) share one
back-off sequence and one attempt budget; an engine that stayed up that long resets them.
A hung engine (a step that does not return, a stopped process: ``EngineCoreClient.stalled``,
checked a few times a second while ``stall_timeout_s`` is set) is killed and then replaced like
a dead one, its requests failed with the reason. A replacement engine gets the LoRA adapters
loaded at run time (and loses those unloaded since) before it takes a request: `RuntimeLoras`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from radixserve.frontend.core_client import EngineCoreClient, EngineDeadError
from radixserve.messages import EngineReady
from radixserve.cluster.engine_launcher import LocalLauncher
from radixserve.cluster.runtime_loras import RuntimeLoras


@dataclass(frozen=True)
class RestartPolicy:
    enabled: bool = True
    max_attempts: int = 5  # consecutive failed restarts before giving up
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_after_s: float = 60.0
    stall_timeout_s: float = 30.0  # silence with work in flight that means a hang (0: off)

    def delay(self, num_failures: int) -> float:
        """Seconds to wait before the next start after ``num_failures`` consecutive ones:
        0 (the first restart is immediate), then base, 2·base, 4·base … up to the cap."""
        if num_failures == 0:
            return 0.0
        return min(self.base_delay_s * 2 ** (num_failures - 1), self.max_delay_s)


def _log(message: str) -> None:
    print(f"radixserve: {message}", file=sys.stderr, flush=True)


class EngineSupervisor:
    """Owns the engine process behind ``client``; ``build`` is what the process builds
    (picklable: each start spawns a fresh interpreter); ``folder`` holds its ipc sockets;
    ``label`` starts its log lines and death reasons (a data-parallel replica's "replica 1: ");
    ``launcher`` starts each engine (`engine_launcher`; the client was bound to its
    generation-0 addresses); ``loras``: the adapters each new engine is brought to (shared
    with the other replicas' supervisors)."""

    def __init__(self, client: EngineCoreClient, build, folder: str,
                 startup_timeout: float, policy: RestartPolicy, label: str = "",
                 launcher=None, loras: RuntimeLoras | None = None) -> None:
        self.client = client
        self.loras = loras or RuntimeLoras()
        self._reloads: asyncio.Task | None = None
        self.launcher = launcher or LocalLauncher()
        self.label = label
        self.build = build
        self.folder = folder
        self.startup_timeout = startup_timeout
        self.policy = policy
        self.num_restarts = 0
        self._generation = 0
        self._num_failures = 0
        self._ready_at = 0.0
        self._proc = None  # the engine's handle (engine_launcher)
        self._task: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        """The current engine process (None before the first start)."""
        return None if self._proc is None else self._proc.pid

    async def start(self) -> EngineReady:
        """Start the first engine on the client's sockets; RuntimeError if it fails."""
        return await self._spawn()

    def watch(self, on_fatal: Callable[[str], None],
              on_restart: Callable[[], None] = lambda: None) -> None:
        """From now on, replace a dead engine (``on_restart`` before each new start), or call
        ``on_fatal(reason)`` when it cannot or may not be."""
        self._task = asyncio.ensure_future(self._supervise(on_fatal, on_restart))

    async def close(self, timeout: float = 10.0) -> None:
        """Stop supervising, shut the engine down (killed if it does not exit in time) and
        close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        proc = self._proc
        alive = proc.is_alive if proc is not None else None
        await self.client.shutdown(alive, timeout=timeout)
        if proc is not None:
            await proc.stop(grace_s=1.0)

    async def _supervise(self, on_fatal, on_restart) -> None:
        while True:
            reason = f"{self.label}{await self._ended()}"
            _log(reason)
            if time.monotonic() - self._ready_at >= self.policy.stable_after_s:
                self._num_failures = 0
            if not self.policy.enabled:
                self.client.mark_dead(reason)
                on_fatal(f"{reason} (engine restarts are off: --no-engine-restart)")
                return
            self.client.mark_dead(f"{reason}; it is being restarted")
            if not await self._restart(reason, on_restart):
                on_fatal(f"{reason}; gave up after {self.policy.max_attempts} restart "
                         "attempts")
                return

    async def _ended(self) -> str:
        """Wait until the engine exits, or hangs (then kill it, SIGKILL: a stopped process
        ignores anything milder); say why it ended."""
        tasks = [asyncio.ensure_future(self._proc.exited())]
        if self.policy.stall_timeout_s:
            tasks.append(asyncio.ensure_future(self._stalled()))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if tasks[0] in done:
            return tasks[0].result()
        reason = tasks[1].result()
        _log(f"{self.label}the engine (pid {self._proc.pid}) is hung: killing it")
        await self._proc.stop(grace_s=0)
        await self._proc.exited()
        return reason

    async def _stalled(self) -> str:
        """Return why once the engine counts as hung (`EngineCoreClient.stalled`)."""
        timeout = self.policy.stall_timeout_s
        interval = min(1.0, max(0.05, timeout / 8))
        while (reason := self.client.stalled(timeout)) is None:
            await asyncio.sleep(interval)
        return reason

    async def _restart(self, reason: str, on_restart) -> bool:
        """Start engines until one is ready (True) or the attempts are used up (False)."""
        while self._num_failures < self.policy.max_attempts:
            await asyncio.sleep(self.policy.delay(self._num_failures))
            self._num_failures += 1
            attempt = f"restart attempt {self._num_failures} of {self.policy.max_attempts}"
            _log(f"{self.label}starting a new engine ({attempt})")
            self.num_restarts += 1
            on_restart()
            self.client.rebind(*self._addresses())
            try:
                ready = await self._spawn()
            except RuntimeError as exc:
                _log(f"{self.label}{attempt} failed: {exc}")
                self.client.dead = f"{reason}; {attempt} failed: {exc}"
                continue
            _log(f"{self.label}the new engine is ready (pid {self._proc.pid}, "
                 f"{ready.num_kv_blocks} KV blocks)")
            return True
        return False

    def _addresses(self) -> tuple[str, str]:
        self._generation += 1
        return self.launcher.addresses(self.folder, self._generation)

    async def _spawn(self) -> EngineReady:
        """Start an engine on the client's current sockets and wait until it is ready; on
        failure it is gone (killed if need be) and RuntimeError says why."""
        try:
            proc = await asyncio.wait_for(
                self.launcher.start(self.build, self.client.input_addr,
                                    self.client.output_addr), self.startup_timeout)
        except TimeoutError:
            raise RuntimeError(f"the engine was not placed within {self.startup_timeout:.0f} "
                               "s") from None
        self._proc = proc
        try:
            ready = await self.client.wait_ready(proc.is_alive, self.startup_timeout)
            calls = self.loras.calls_for(ready.loras)
            replies = self.client.send_lora_calls(calls)  # ahead of any request
        except BaseException:
            await proc.stop(grace_s=0)
            raise
        self.client.start()
        self._ready_at = time.monotonic()
        if calls:
            self._reloads = asyncio.ensure_future(self._settle_loras(calls, replies))
        return ready

    async def _settle_loras(self, calls: list, replies: list[asyncio.Future]) -> None:
        """Log how a new engine's LoRA calls went; an adapter it could not load again is
        forgotten (`RuntimeLoras.forget`: no longer listed nor served)."""
        for (name, path), reply in zip(calls, replies, strict=True):
            try:
                reply = await reply
            except EngineDeadError:
                return  # this engine died too: its replacement is told again
            if reply.error is None:
                _log(f"{self.label}LoRA adapter {name!r} "
                     f"{'loaded again from ' + path if path else 'unloaded, as before'}")
            elif path is not None:
                _log(f"{self.label}LoRA adapter {name!r} could not be loaded again, so it is "
                     f"no longer served: {reply.error}")
                self.loras.forget(name)

