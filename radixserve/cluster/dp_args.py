"""``radixserve serve`` flags for data parallel, and the per-replica builds they make."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

from radixserve.arg_types import fraction, non_negative_int, positive_int
from radixserve.cpu.split import affinity_list, pin_to, replica_threads, split_cpus
from radixserve.cpu.topology import CpuTopology
from radixserve.cluster.ray_executor import PLACEMENT_STRATEGIES, RayConfig
from radixserve.cluster.routing import ROUTING_POLICIES, RoutingConfig


def add_dp_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data parallel")
    g.add_argument("--data-parallel-size", type=positive_int, default=1, metavar="N",
                   help="engine replicas, each its own process, KV pool (--num-kv-blocks / "
                        "--kv-cache-memory-gb are per replica) and prefix cache, pinned to "
                        "its share of the CPUs, behind this one API process")
    g.add_argument("--dp-routing", default="cache_aware", choices=ROUTING_POLICIES,
                   help="which replica gets a request: the longest prefix it was sent before "
                        "(unless it is too busy: --dp-balance-threshold), each in turn, or "
                        "the fewest requests in flight")
    g.add_argument("--dp-balance-threshold", type=non_negative_int, default=16, metavar="N",
                   help="cache_aware: a replica with more than N requests in flight beyond "
                        "the least busy one loses the request to a less busy one")
    g.add_argument("--distributed-executor-backend", default="mp", choices=("mp", "ray"),
                   help="where the replicas run: mp, child processes of this one; ray, "
                        "actors on an existing Ray cluster (ray start --head; needs "
                        "pip install 'radixserve[ray]')")
    g.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS", "auto"),
                   metavar="ADDR", help="ray: the cluster to join, host:port of its head or "
                                        "auto (env RAY_ADDRESS; default auto: the one "
                                        "running on this machine)")
    g.add_argument("--ray-placement-strategy", default="SPREAD", choices=PLACEMENT_STRATEGIES,
                   help="ray: how the replicas' bundles go on the nodes (SPREAD: one per "
                        "node while there are enough, else shared; STRICT_SPREAD: never "
                        "shared; PACK: as few nodes as fit)")
    g.add_argument("--ray-cpus-per-replica", type=positive_int, default=None, metavar="N",
                   help="ray: CPUs each replica's bundle reserves, and its threads unless "
                        "--threads says (default: --threads, else 1; on real nodes, a "
                        "node's or a NUMA node's cores)")
    g.add_argument("--dp-cache-threshold", type=fraction, default=0.5, metavar="F",
                   help="cache_aware: a replica's prefix match counts only if it covers at "
                        "least this fraction of the prompt (a short preamble all prompts "
                        "share does not decide)")


def routing_config(args: argparse.Namespace) -> RoutingConfig:
    return RoutingConfig(args.dp_routing, args.dp_balance_threshold, args.dp_cache_threshold)


def ray_config(args: argparse.Namespace) -> RayConfig | None:
    """The Ray placement ``--distributed-executor-backend ray`` asks for (None: mp)."""
    if args.distributed_executor_backend != "ray":
        return None
    return RayConfig(args.ray_address, args.ray_placement_strategy,
                     args.ray_cpus_per_replica or args.threads or 1)


def replica_builds(num_replicas: int, make_build: Callable[[int | None], object],
                   requested_threads: int | None, ray: RayConfig | None = None) -> list:
    """One picklable build per replica. ``make_build(threads)`` is the engine build with that
    thread count. One replica is built as before (no pinning); several are each pinned to
    their run of CPUs (see `cpu_split`). Ray replicas run on other machines: no local CPUs
    to pin, each runs its bundle's CPUs as threads (unless ``requested_threads``)."""
    if ray is not None:
        return [make_build(requested_threads or ray.cpus_per_replica)] * num_replicas
    if num_replicas == 1:
        return [make_build(requested_threads)]
    cpus, topology = affinity_list(), CpuTopology.read()
    runs = split_cpus(cpus, num_replicas, topology)
    print(f"radixserve: {topology.describe(cpus)} for {num_replicas} replicas",
          file=sys.stderr, flush=True)
    builds = []
    for i, cpus in enumerate(runs):
        threads = replica_threads(num_replicas, cpus, requested_threads)
        print(f"radixserve: replica {i}: CPUs {_cpu_ranges(cpus)}, {threads} threads",
              file=sys.stderr, flush=True)
        builds.append(functools.partial(build_pinned, cpus, make_build(threads)))
    return builds


def build_pinned(cpus: list[int], build):
    """In the replica's process: pin it, then build its engine (torch loads after this)."""
    pin_to(cpus)
    return build()


def _cpu_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2,5" (as taskset and /proc write them)."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
