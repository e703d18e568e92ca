"""The CPUs of the API process's affinity mask divided between data-parallel replicas, along
the machine's topology (`cpu_topology`: NUMA nodes, and the hyperthreads of each core).

    2 nodes × 4 cores × 2 threads, 2 replicas  →  replica 0: node 0's 8 CPUs, replica 1: node 1's
    1 node, cores {0,4} {1,5} {2,6} {3,7}, 2 replicas  →  {0,1,4,5} {2,3,6,7}  (whole cores)

1. A replica gets whole cores (a core's sibling threads share its caches and units: two
   replicas on one core would compete on every step).
2. With at least as many replicas as nodes, each node gets replicas in proportion to its
   cores (every node one at least; the next goes where the cores per replica are most), and
   a node's cores are split between its replicas in contiguous runs differing by at most
   one: no replica spans two nodes' memory, even where that makes replicas unequal.
   Fewer replicas than nodes: each gets a run of whole nodes.
3. More replicas than cores: they share cores, each given hyperthreads (a WARNING); more
   than CPUs: they share CPUs round-robin (a WARNING).
Each replica pins itself (``sched_setaffinity``) before torch loads and runs as many threads as
its share of ``available_cpus()`` (which also counts the cgroup quota), unless ``--threads``
says. Torch-free: the API process imports it.
"""

from __future__ import annotations

import logging
import os

from radixserve.cpu.threads import available_cpus
from radixserve.cpu.topology import CpuTopology

logger = logging.getLogger(__name__)
_FLAT = CpuTopology()  # one node, one core per CPU


def affinity_list() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def split_cpus(cpus: list[int], num_replicas: int,
               topology: CpuTopology = _FLAT) -> list[list[int]]:
    """``cpus`` divided between ``num_replicas`` along ``topology`` (the module docstring's
    rules); each replica's CPUs sorted."""
    assert num_replicas >= 1 and cpus
    if num_replicas > len(cpus):
        logger.warning("%d data-parallel replicas on %d CPUs: replicas share CPUs",
                       num_replicas, len(cpus))
        return [[cpus[i % len(cpus)]] for i in range(num_replicas)]
    nodes = _cores_by_node(cpus, topology)
    num_cores = sum(len(cores) for cores in nodes)
    if num_replicas > num_cores:
        logger.warning("%d data-parallel replicas on %d cores: replicas share cores "
                       "(hyperthread siblings)", num_replicas, num_cores)
        flat = [cpu for cores in nodes for core in cores for cpu in core]
        return [sorted(run) for run in _even_runs(flat, num_replicas)]
    if num_replicas >= len(nodes):
        runs = []  # each a list of cores
        for cores, share in zip(nodes, _apportion(num_replicas, [len(n) for n in nodes])):
            runs += _even_runs(cores, share)
    else:
        runs = [[core for cores in group for core in cores]
                for group in _even_runs(nodes, num_replicas)]
    return [sorted(cpu for core in run for cpu in core) for run in runs]


def _cores_by_node(cpus: list[int], topology: CpuTopology) -> list[list[list[int]]]:
    """Node by node (in node order), its cores (by first CPU), each its CPUs of ``cpus``."""
    nodes: dict[int, dict[int, list[int]]] = {}
    for cpu in sorted(cpus):
        nodes.setdefault(topology.node(cpu), {}).setdefault(topology.core(cpu), []).append(cpu)
    return [sorted(cores.values()) for _, cores in sorted(nodes.items())]


def _even_runs(items: list, num_runs: int) -> list[list]:
    """``items`` in ``num_runs`` contiguous runs, sizes differing by at most one (the larger
    first); none for 0."""
    base, extra = divmod(len(items), num_runs) if num_runs else (0, 0)
    runs, start = [], 0
    for i in range(num_runs):
        size = base + (i < extra)
        runs.append(items[start:start + size])
        start += size
    return runs


def _apportion(num_replicas: int, sizes: list[int]) -> list[int]:
    """Replicas per node (``num_replicas`` >= nodes, <= their cores): one each, then each
    next one to the node with the most cores per replica (ties: the lower node)."""
    shares = [1] * len(sizes)
    for _ in range(num_replicas - len(sizes)):
        i = max((i for i in range(len(sizes)) if shares[i] < sizes[i]),
                key=lambda i: (sizes[i] / shares[i], -i))
        shares[i] += 1
    return shares


def replica_threads(num_replicas: int, cpu_set: list[int], requested: int | None) -> int:
    """A replica's thread count: ``requested``, else its CPUs, at most its share of the
    CPUs this process may use (a cgroup quota of 2 CPUs split 2 ways is 1 thread each)."""
    if requested is not None:
        return requested
    return max(1, min(len(cpu_set), available_cpus() // num_replicas))


def pin_to(cpus: list[int]) -> None:
    """Restrict this process (called in the replica, before torch loads) to ``cpus``."""
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError) as exc:
        logger.warning("could not pin the replica to CPUs %s: %s", cpus, exc)


def pin_process(cpus: list[int]) -> None:
    """Restrict every thread of this process to ``cpus`` (threads started later inherit it)."""
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cpus)
        except (AttributeError, OSError) as exc:
            logger.warning("could not pin thread %d to CPUs %s: %s", tid, cpus, exc)
