"""The CPU split along the machine's topology, read from fake sysfs trees: replicas get whole
cores (hyperthread siblings together) and stay within a NUMA node when they fit; more replicas
than cores share cores, more than nodes split the nodes, fewer take whole nodes; a tree
without node or topology files is one node of single-thread cores, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.cpu.split import split_cpus
from radixserve.cpu.topology import CpuTopology, parse_cpu_list


def _sysfs(root: Path, nodes: dict[int, str], siblings: dict[int, str]) -> str:
    """A sysfs layout: ``nodes`` node → its cpulist, ``siblings`` cpu → its siblings list."""
    for node, cpulist in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (root / "node" / "online").parent.mkdir(parents=True, exist_ok=True)
    (root / "node" / "online").write_text("0\n")  # not a node folder: ignored
    for cpu, sib in siblings.items():
        (root / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(sib + "\n")
    return str(root)


def _two_sockets(tmp_path) -> CpuTopology:
    """2 nodes × 4 cores × 2 threads, numbered as Linux does: node 0 has CPUs 0-3 and their
    siblings 8-11, node 1 has 4-7 and 12-15."""
    siblings = {c: f"{c % 8},{c % 8 + 8}" for c in range(16)}
    return CpuTopology.read(_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"}, siblings))


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []


def test_the_topology_is_read_from_sysfs(tmp_path):
    t = _two_sockets(tmp_path)
    assert t.num_nodes == 2
    assert [t.node(c) for c in (0, 3, 4, 8, 12, 15)] == [0, 0, 1, 0, 1, 1]
    assert [t.core(c) for c in (0, 8, 5, 13)] == [0, 0, 5, 5]
    assert t.describe(list(range(16))) == "2 NUMA nodes, 8 cores, 16 CPUs"


def test_one_replica_per_node_gets_the_whole_node(tmp_path):
    t = _two_sockets(tmp_path)
    assert split_cpus(list(range(16)), 2, t) == [[0, 1, 2, 3, 8, 9, 10, 11],
                                                 [4, 5, 6, 7, 12, 13, 14, 15]]


def test_replicas_get_whole_cores_within_their_node(tmp_path):
    t = _two_sockets(tmp_path)
    runs = split_cpus(list(range(16)), 4, t)
    assert runs == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    # 3 replicas on 2 nodes: 2 on one node, the third alone on the other, none spanning both
    assert split_cpus(list(range(16)), 3, t) == [[0, 1, 8, 9], [2, 3, 10, 11],
                                                 [4, 5, 6, 7, 12, 13, 14, 15]]
    # the old contiguous split would have given replica 0 CPUs 0-7: both nodes, half cores
    assert split_cpus(list(range(16)), 2) == [list(range(8)), list(range(8, 16))]


def test_fewer_replicas_than_nodes_take_whole_nodes(tmp_path):
    nodes = {n: f"{2 * n}-{2 * n + 1}" for n in range(4)}
    t = CpuTopology.read(_sysfs(tmp_path, nodes, {}))
    assert split_cpus(list(range(8)), 2, t) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_cpus(list(range(8)), 3, t) == [[0, 1, 2, 3], [4, 5], [6, 7]]


def test_more_replicas_than_cores_share_cores_with_a_warning(tmp_path, caplog):
    t = _two_sockets(tmp_path)
    cpus = [0, 1, 8, 9]  # an affinity mask of 2 cores of node 0
    assert split_cpus(cpus, 2, t) == [[0, 8], [1, 9]]
    assert split_cpus(cpus, 3, t) == [[0, 8], [1], [9]]
    assert "share cores" in caplog.text


def test_the_affinity_mask_limits_what_is_split(tmp_path):
    t = _two_sockets(tmp_path)
    # the mask holds 1 core of node 0 and 3 of node 1 (threads 0/8, 4-6/12-14): each replica
    # still keeps to its node
    cpus = [0, 8, 4, 5, 6, 12, 13, 14]
    assert split_cpus(cpus, 2, t) == [[0, 8], [4, 5, 6, 12, 13, 14]]


def test_a_tree_without_topology_files_is_one_node_of_single_thread_cores(tmp_path):
    t = CpuTopology.read(str(tmp_path))
    assert t.num_nodes == 1 and t.core(5) == 5 and t.node(5) == 0
    assert split_cpus(list(range(7)), 2, t) == [[0, 1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4, 5, 8])
def test_every_cpu_is_given_once_and_no_core_is_split(tmp_path, num_replicas):
    t = _two_sockets(tmp_path)
    runs = split_cpus(list(range(16)), num_replicas, t)
    assert len(runs) == num_replicas
    assert sorted(c for r in runs for c in r) == list(range(16))
    for run in runs:
        assert {t.core(c) for c in run} == {t.core(c) for c in run for c in (c % 8, c % 8 + 8)}
        assert len({t.node(c) for c in run}) == 1 or num_replicas == 1
