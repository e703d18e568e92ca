"""``--distributed-executor-backend ray``: the data-parallel replicas as Ray actors.

    API process (a Ray driver)                       Ray cluster (ray start --head / --address)
    ray.init(address)  ── placement group ──▶  bundle 0 {CPU: c}   bundle 1 {CPU: c}  ...
    client i binds tcp://<driver node ip>:*          actor replica-0      actor replica-1
             ◀──── the same ZMQ messages as ipc: one per engine step ────▶ run_engine_core()

Each replica is one actor in its own bundle of the placement group (``--ray-cpus-per-replica``
CPUs; ``--ray-placement-strategy``, default SPREAD: one replica per node while there are nodes
enough, several on one node otherwise, so a one-machine cluster works too; STRICT_SPREAD
refuses to share a node). The actor runs the same ``run_engine_core`` loop as a local engine
process, inside one long actor call; that call ending (the loop returned, or the actor died:
killed, its node lost, as Ray's own health checks find) is the replica's death, handled as a
local process's: its requests fail, the supervisor starts a new actor in the same bundle.

Transport: the API process binds both sockets on tcp (its Ray node's IP, a free port each) and
the actor connects, the direction ipc uses, so the client code is the same. NOTE: these
sockets, like Ray's own ports, carry no authentication: a Ray cluster is a trusted network.

Clean shutdown: every actor is killed (after its Shutdown had a second to end the loop) and the
placement group removed; the driver disconnects (a cluster radixserve did not start is left
running). The workers import radixserve: it must be installed on every node.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from dataclasses import dataclass

PLACEMENT_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")
NAMESPACE = "radixserve"
INSTALL_HINT = "pip install 'radixserve[ray]' (or pip install ray)"


def require_ray():
    """The ``ray`` module, or SystemExit saying how to get it."""
    try:
        import ray
    except ImportError:
        raise SystemExit("radixserve: error: --distributed-executor-backend ray needs Ray, "
                         f"which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass(frozen=True)
class RayConfig:
    address: str = "auto"  # ray.init's: "auto", host:port of the head, ray://host:port
    placement_strategy: str = "SPREAD"
    cpus_per_replica: int = 1
    placement_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"unknown placement strategy {self.placement_strategy!r}; "
                             f"supported: {', '.join(PLACEMENT_STRATEGIES)}")
        if self.cpus_per_replica < 1:
            raise ValueError(f"CPUs per replica must be >= 1, got {self.cpus_per_replica}")


class _EngineActor:
    """One replica's process on its node (made a Ray actor class in `RayPlacement`)."""

    def where(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), os.getpid()

    def serve(self, build, input_addr: str, output_addr: str) -> None:
        from radixserve.engine.core_proc import run_engine_core

        run_engine_core(build, input_addr, output_addr)


class RayPlacement:
    """A connection to a Ray cluster and one placement group: bundle i holds replica i."""

    def __init__(self, ray, config: RayConfig, pg, is_connected_here: bool) -> None:
        self.ray = ray
        self.config = config
        self.pg = pg
        self.is_connected_here = is_connected_here  # False: the caller's ray.init, kept
        self.uid = uuid.uuid4().hex[:8]
        self.host = ray.util.get_node_ip_address()  # where the clients bind
        self.actor_class = ray.remote(num_cpus=config.cpus_per_replica)(_EngineActor)

    @classmethod
    async def connect(cls, config: RayConfig, num_replicas: int) -> RayPlacement:
        """Connect (unless this process already is) and reserve the bundles; RuntimeError
        when there is no cluster at the address or it cannot hold them in time."""
        ray = require_ray()
        is_connected_here = not ray.is_initialized()
        if is_connected_here:
            try:
                ray.init(address=config.address, namespace=NAMESPACE, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RuntimeError(f"no Ray cluster at --ray-address {config.address}: {exc} "
                                   "(start one with `ray start --head`)") from None
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles = [{"CPU": config.cpus_per_replica} for _ in range(num_replicas)]
        pg = placement_group(bundles, strategy=config.placement_strategy,
                             name=f"radixserve-{os.getpid()}")
        try:
            await asyncio.wait_for(asyncio.wrap_future(pg.ready().future()),
                                   config.placement_timeout_s)
        except TimeoutError:
            remove_placement_group(pg)
            have = ray.cluster_resources().get("CPU", 0)
            if is_connected_here:
                ray.shutdown()
            raise RuntimeError(
                f"Ray could not place {num_replicas} replicas of {config.cpus_per_replica} "
                f"CPUs ({config.placement_strategy}) within {config.placement_timeout_s:.0f} s;"
                f" the cluster has {have:g} CPUs (--ray-cpus-per-replica, "
                "--ray-placement-strategy)") from None
        _log(f"Ray placement group {pg.id.hex()[:12]}: {num_replicas} bundles of "
             f"{config.cpus_per_replica} CPUs, {config.placement_strategy}")
        return cls(ray, config, pg, is_connected_here)

    def launcher(self, replica: int) -> RayLauncher:
        return RayLauncher(self, replica)

    def close(self) -> None:
        """Remove the placement group and disconnect (after the replicas were stopped)."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)
        if self.is_connected_here:
            self.ray.shutdown()


class RayLauncher:
    """Starts replica ``replica``'s engines, each a new actor in its bundle."""

    def __init__(self, placement: RayPlacement, replica: int) -> None:
        self.placement = placement
        self.replica = replica
        self._num_started = 0

    def addresses(self, folder: str, generation: int) -> tuple[str, str]:
        host = self.placement.host
        return f"tcp://{host}:*", f"tcp://{host}:*"

    async def start(self, build, input_addr: str, output_addr: str) -> RayActorHandle:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        p = self.placement
        self._num_started += 1
        actor = p.actor_class.options(
            name=f"radixserve-{p.uid}-replica{self.replica}-{self._num_started}",
            max_restarts=0,  # the supervisor restarts it, with its back-off and budget
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                p.pg, placement_group_bundle_index=self.replica)).remote()
        try:
            node_ip, pid = await asyncio.wrap_future(actor.where.remote().future())
        except BaseException as exc:
            p.ray.kill(actor, no_restart=True)
            if isinstance(exc, p.ray.exceptions.RayError):
                raise RuntimeError(f"the engine actor did not start: {_first_line(exc)}") \
                    from None
            raise
        done = asyncio.wrap_future(actor.serve.remote(build, input_addr, output_addr).future())
        return RayActorHandle(p.ray, actor, node_ip, pid, done)


class RayActorHandle:
    """One replica actor and its ``serve`` call (``done``: that call's future)."""

    def __init__(self, ray, actor, node_ip: str, pid: int, done: asyncio.Future) -> None:
        self.ray = ray
        self.actor = actor
        self.node_ip = node_ip
        self.pid = pid
        self._done = done

    def is_alive(self) -> bool:
        return not self._done.done()

    async def exited(self) -> str:
        """Return once the actor's engine loop has ended, saying how; the actor is killed if
        it still lives (a loop that returned leaves it holding its bundle's CPUs, which its
        replacement needs)."""
        try:
            await asyncio.shield(self._done)
        except self.ray.exceptions.RayError as exc:
            return f"the engine actor (pid {self.pid} on {self.node_ip}) died: " \
                   f"{_first_line(exc)}"
        self.ray.kill(self.actor, no_restart=True)
        return f"the engine actor (pid {self.pid} on {self.node_ip}) ended its loop"

    async def stop(self, grace_s: float = 1.0) -> None:
        """Give the loop ``grace_s`` to end (after a Shutdown), then kill the actor and wait
        (at most 10 s) until Ray has it dead: nothing of it is left."""
        if grace_s:
            await asyncio.wait([self._done], timeout=grace_s)
        self.ray.kill(self.actor, no_restart=True)
        await asyncio.wait([self._done], timeout=10)
        if self._done.done():
            self._done.exception()  # retrieved: the kill's ActorDiedError is expected


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def _log(message: str) -> None:
    print(f"radixserve: {message}", file=sys.stderr, flush=True)
