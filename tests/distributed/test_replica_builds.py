"""The per-replica builds ``--data-parallel-size`` makes: one replica is built as before (no
pinning, the requested threads); several each get their run of CPUs and its thread count."""

from __future__ import annotations

import functools
import os

from radixserve.cluster import dp_args
from radixserve.cpu.topology import CpuTopology
from radixserve.cluster.dp_args import build_pinned, replica_builds


def _make_build(threads):
    return functools.partial(dict, threads=threads)


def test_one_replica_is_built_unpinned_with_the_requested_threads():
    [build] = replica_builds(1, _make_build, None)
    assert build() == {"threads": None}


def test_replicas_get_disjoint_cpu_runs_and_their_share_of_threads(monkeypatch):
    monkeypatch.setattr(dp_args, "affinity_list", lambda: [0, 1, 2, 3, 4])
    monkeypatch.setattr(dp_args.CpuTopology, "read", CpuTopology)  # one node, no siblings
    monkeypatch.setattr("radixserve.cpu.split.available_cpus", lambda: 5)
    builds = replica_builds(2, _make_build, None)
    assert [b.func for b in builds] == [build_pinned, build_pinned]
    assert [b.args[0] for b in builds] == [[0, 1, 2], [3, 4]]
    assert [b.args[1]() for b in builds] == [{"threads": 2}, {"threads": 2}]  # 5 // 2
    builds = replica_builds(2, _make_build, 3)
    assert [b.args[1]() for b in builds] == [{"threads": 3}, {"threads": 3}]


def test_build_pinned_pins_the_calling_process_first():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    try:
        assert build_pinned([cpu], lambda: os.sched_getaffinity(0)) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
