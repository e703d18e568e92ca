"""The CPUs of the API process's affinity mask divided between data-parallel replicas.

    affinity {0..7}, 2 replicas  →  replica 0: {0,1,2,3}   replica 1: {4,5,6,7}

Contiguous runs of CPU numbers, sizes differing by at most one; Linux numbers a socket's (a
NUMA node's) cores consecutively, so with one replica per socket each stays on its own memory.
More replicas than CPUs share them round-robin (a WARNING: they then compete). Each replica
pins itself (``sched_setaffinity``) before torch loads and runs as many threads as its share
of ``available_cpus()`` (which also counts the cgroup quota), unless ``--threads`` says.
Torch-free: the API process imports it.
"""

from __future__ import annotations

import logging
import os

from radixserve.cpu_threads import available_cpus

logger = logging.getLogger(__name__)


def affinity_list() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def split_cpus(cpus: list[int], num_replicas: int) -> list[list[int]]:
    """``cpus`` in ``num_replicas`` contiguous runs (or shared round-robin if too few)."""
    assert num_replicas >= 1 and cpus
    if num_replicas > len(cpus):
        logger.warning("%d data-parallel replicas on %d CPUs: replicas share CPUs",
                       num_replicas, len(cpus))
        return [[cpus[i % len(cpus)]] for i in range(num_replicas)]
    base, extra = divmod(len(cpus), num_replicas)
    runs, start = [], 0
    for i in range(num_replicas):
        size = base + (i < extra)
        runs.append(cpus[start:start + size])
        start += size
    return runs


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
