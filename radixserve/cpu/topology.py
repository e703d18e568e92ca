"""Which NUMA node and which physical core each CPU belongs to, from Linux's sysfs.

    /sys/devices/system/node/node1/cpulist                      "8-15,24-31"  → node 1
    /sys/devices/system/cpu/cpu24/topology/thread_siblings_list "8,24"        → core 8

A core is named by its smallest sibling's CPU number (unique across sockets). What sysfs does
not say (no node folders: a kernel without NUMA, a container hiding them; no topology files)
is taken as one node and one core per CPU, the layout `split_cpus` assumed before it read any.
Torch-free: the API process imports it.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SYSFS = "/sys/devices/system"


def parse_cpu_list(text: str) -> list[int]:
    """ "0-3,8,10-11" → [0, 1, 2, 3, 8, 10, 11] (the kernel's list format; "" → [])."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


@dataclass(frozen=True)
class CpuTopology:
    node_of: dict[int, int] = field(default_factory=dict)  # CPU → NUMA node
    core_of: dict[int, int] = field(default_factory=dict)  # CPU → its core (smallest sibling)

    def node(self, cpu: int) -> int:
        return self.node_of.get(cpu, 0)

    def core(self, cpu: int) -> int:
        return self.core_of.get(cpu, cpu)

    @property
    def num_nodes(self) -> int:
        return len(set(self.node_of.values())) or 1

    @classmethod
    def read(cls, root: str = SYSFS) -> CpuTopology:
        """The topology under ``root`` (sysfs, or a copy of its layout in a test)."""
        node_of: dict[int, int] = {}
        for path in glob.glob(os.path.join(root, "node", "node[0-9]*", "cpulist")):
            node = int(os.path.basename(os.path.dirname(path))[len("node"):])
            for cpu in parse_cpu_list(_read(path)):
                node_of[cpu] = node
        core_of: dict[int, int] = {}
        pattern = os.path.join(root, "cpu", "cpu[0-9]*", "topology", "thread_siblings_list")
        for path in glob.glob(pattern):
            cpu = int(os.path.basename(os.path.dirname(os.path.dirname(path)))[len("cpu"):])
            siblings = parse_cpu_list(_read(path))
            core_of[cpu] = min(siblings, default=cpu)
        return cls(node_of, core_of)

    def describe(self, cpus: list[int]) -> str:
        """ "2 NUMA nodes, 8 cores, 16 CPUs" of ``cpus``, for the start-up line."""
        nodes = {self.node(c) for c in cpus}
        cores = {self.core(c) for c in cpus}
        return (f"{len(nodes)} NUMA node{'s' * (len(nodes) != 1)}, {len(cores)} cores, "
                f"{len(cpus)} CPUs")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:  # a file that vanished or is unreadable: that CPU as if alone
        logger.warning("could not read %s: %s", path, exc)
        return ""
