"""The thread governor sizes the team from what other processes take of the engine's CPUs."""

from __future__ import annotations

import pytest

from radixserve.engine.thread_governor import FixedThreads, ThreadGovernor, busy_ticks


class _Machine:
    """A fake clock, busy ticks of the engine's CPUs and the engine's own CPU seconds."""

    def __init__(self) -> None:
        self.now, self.ticks, self.own = 0.0, 0, 0.0
        self.applied: list[int] = []

    def run(self, gov: ThreadGovernor, seconds: float, engine_cpus: float,
            other_cpus: float) -> None:
        """``seconds`` of steps (0.1 s each) with the engine using ``engine_cpus`` and other
        processes ``other_cpus``."""
        hz = 100  # the test's clock ticks (os.sysconf says 100 on Linux too)
        gov._hz = hz
        for _ in range(round(seconds / 0.1)):
            self.now += 0.1
            self.own += 0.1 * engine_cpus
            self.ticks += round(0.1 * (engine_cpus + other_cpus) * hz)
            gov.observe(4, 0.1)


def _governor(machine: _Machine, threads: int = 2) -> ThreadGovernor:
    return ThreadGovernor(threads, machine.applied.append, cpus={0, 1},
                          clock=lambda: machine.now, ticks=lambda: machine.ticks,
                          own_seconds=lambda: machine.own)


def test_a_busy_neighbour_takes_a_thread_and_its_leaving_gives_it_back():
    m = _Machine()
    gov = _governor(m)
    m.run(gov, 2.0, engine_cpus=2.0, other_cpus=0.05)  # idle machine: stays at 2
    assert gov.current == 2 and m.applied == []
    m.run(gov, 2.0, engine_cpus=1.5, other_cpus=0.5)  # a hog gets half a core beside us
    assert gov.current == 1 and m.applied == [1]
    m.run(gov, 2.0, engine_cpus=1.0, other_cpus=1.0)  # still there: stays at 1
    assert m.applied == [1]
    m.run(gov, 2.0, engine_cpus=1.0, other_cpus=0.1)  # gone: back to 2
    assert gov.current == 2 and m.applied == [1, 2]


def test_between_the_marks_nothing_changes_and_niced_work_is_not_counted(tmp_path):
    m = _Machine()
    gov = _governor(m)
    m.run(gov, 3.0, engine_cpus=2.0, other_cpus=0.3)  # neither busy nor free: as it is
    assert gov.current == 2 and m.applied == []
    stat = tmp_path / "stat"
    # cpuN user nice system idle iowait irq softirq steal: nice (5000) is left out
    stat.write_text("cpu  1 2 3 4 5 6 7 8\ncpu0 10 5000 20 99 1 2 3 4\ncpu1 1 1 1 1 1 1 1 1\n"
                    "intr 5\n")
    assert busy_ticks({0}, str(stat)) == 10 + 20 + 2 + 3 + 4
    assert busy_ticks({0, 1}, str(stat)) == 39 + 5


def test_more_cores_lose_one_thread_per_busy_cpu():
    m = _Machine()
    gov = ThreadGovernor(8, m.applied.append, cpus=set(range(8)), clock=lambda: m.now,
                         ticks=lambda: m.ticks, own_seconds=lambda: m.own)
    m.run(gov, 1.0, engine_cpus=6.0, other_cpus=2.0)
    assert gov.current == 6


def test_one_thread_has_nothing_to_choose():
    with pytest.raises(ValueError):
        ThreadGovernor(1, print)
    assert isinstance(ThreadGovernor.for_engine(1, print), FixedThreads)
    FixedThreads().observe(1, 0.1)  # a no-op
