"""The engine's thread count while it runs: its CPUs less those other processes keep busy.

The kernels run on one OpenMP team: every parallel region ends at a barrier that waits for
every thread. When another process (the API process under load, a tokenizer, a build, anything)
takes one of the cores, the thread on it gets that core only between the other's time slices,
and every region waits for it. Measured on 2 cores (Intel Xeon, AMX) with one busy process
beside the server, the embedded model's single stream took 1.86 s a request with 2 threads and
0.65 s with 1 (the idle machine: 0.39 s with 2); 16 streams 193 against 357 tokens/s.
Spinning briefly then sleeping (libgomp's passive wait) helped less (1.01 s) and cost a third
of the speed on the idle machine, so the team keeps spinning and this governor sizes it.

Every half second of steps it reads how busy the engine's CPUs were (``/proc/stat``, the
CPUs of its affinity mask) less what the engine itself used (``os.times``): that is what other
processes took, in CPUs. Niced processes (``nice`` time) do not count: they yield at once. The
team shrinks by the CPUs others keep busy (0.4 of one, or more, counts as one: a process beside
a spinning team gets about half its core) and grows back when they are free (under 0.2). No step is spent probing. The kernels' results do not depend on
the thread count (each row's operations are the same however the work is split), so a change
never changes a token.

``FixedThreads`` is the null object: an engine whose thread count was given (``--threads``), or
that has one CPU, or a system without ``/proc/stat``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_PERIOD_S = 0.5
# CPUs of others' work that take a thread away / give them back (a process beside a spinning
# team gets about half of its core: 0.5 must count as busy)
_BUSY, _FREE = 0.4, 0.2
_STAT = "/proc/stat"


class FixedThreads:
    """The thread count stays as it is."""

    def observe(self, tokens: int, seconds: float) -> None:
        pass


def busy_ticks(cpus: set[int], stat: str = _STAT) -> int:
    """Clock ticks the CPUs ``cpus`` spent on work (user, system, interrupts, stolen by the
    hypervisor; not ``nice``: niced processes yield to us), from ``/proc/stat``."""
    total = 0
    with open(stat) as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *fields = line.split()
            if int(name[3:]) in cpus:
                user, _nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
                total += user + system + irq + softirq + steal
    return total


class ThreadGovernor:
    """Between ``threads`` and 1 (``set_threads(n)`` applies a size, e.g.
    ``torch.set_num_threads``); ``observe`` is called after each model step."""

    def __init__(self, threads: int, set_threads: Callable[[int], None],
                 cpus: set[int] | None = None, clock: Callable[[], float] = time.monotonic,
                 ticks: Callable[[], int] | None = None,
                 own_seconds: Callable[[], float] | None = None) -> None:
        if threads < 2:
            raise ValueError("a governor needs at least 2 threads to choose from")
        self.full = self.current = threads
        cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self._set, self._clock = set_threads, clock
        self._ticks = ticks or (lambda: busy_ticks(cpus))
        self._own = own_seconds or (lambda: sum(os.times()[:2]))
        self._hz = os.sysconf("SC_CLK_TCK")
        self._last = (clock(), self._ticks(), self._own())

    @classmethod
    def for_engine(cls, threads: int, set_threads: Callable[[int], None]):
        """A governor, or ``FixedThreads`` where it cannot read the CPUs' use."""
        try:
            return cls(threads, set_threads)
        except (OSError, ValueError, AttributeError):
            return FixedThreads()

    def observe(self, tokens: int, seconds: float) -> None:
        now = self._clock()
        if now - self._last[0] < _PERIOD_S:
            return
        then, ticks, own = self._last
        self._last = (now, self._ticks(), self._own())
        busy = (self._last[1] - ticks) / self._hz
        others = max(0.0, busy - (self._last[2] - own)) / (now - then)  # in CPUs
        want = self.current  # between the two marks: as it is
        if others >= _BUSY:  # each CPU others keep busy, from _BUSY of one, is a thread less
            want = max(1, self.full - math.floor(others + 1 - _BUSY))
        elif others < _FREE:
            want = self.full
        if want != self.current:
            logger.info("threads: %d -> %d (other processes use %.1f of the engine's CPUs)",
                        self.current, want, others)
            self.current = want
            self._set(want)
