"""Time limits for grammar work in CPU seconds, not wall seconds.

A grammar compile or check runs on a pool thread and cannot be interrupted. Its limit is
there to refuse grammars too complex to compile, so it is measured in the CPU time the work
itself has used: on a machine busy with other work a compile gets less of the CPU and takes
longer on the clock, and must not fail for that. Time spent queued behind other compiles is
not counted either. A much longer wall-clock backstop still ends a wait that an overloaded
machine would make endless, with its own message.

`CpuTimedJob` wraps the work; any thread can read how much CPU the job has used so far.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

WALL_BACKSTOP_FACTOR = 12.0
"""The wall-clock backstop, as a multiple of the CPU budget."""


class CpuTimedJob:
    """``fn(*args)`` to submit to a pool; `cpu_seconds` is what it has used so far (0 until it
    starts). Where a thread's CPU clock cannot be read it falls back to wall time since the
    start."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._clock: int | None = None
        self._cpu_start = 0.0
        self._wall_start: float | None = None
        self.submitted = time.monotonic()

    def __call__(self) -> Any:
        try:
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
            self._cpu_start = time.clock_gettime(self._clock)
        except (AttributeError, OSError):  # no per-thread CPU clock here
            self._clock = None
        self._wall_start = time.monotonic()
        return self._fn(*self._args)

    def cpu_seconds(self) -> float:
        if self._wall_start is None:
            return 0.0
        if self._clock is None:
            return time.monotonic() - self._wall_start
        try:
            return time.clock_gettime(self._clock) - self._cpu_start
        except OSError:  # the thread is gone
            return 0.0

    def overrun(self, budget_s: float, what: str) -> str | None:
        """Why the job must be given up on (its CPU budget or the wall-clock backstop is
        spent), or None."""
        if self.cpu_seconds() > budget_s:
            return (f"{what} used over {budget_s:g} s of CPU time: the grammar is too complex; "
                    "simplify it")
        waited = time.monotonic() - self.submitted
        if waited > budget_s * WALL_BACKSTOP_FACTOR:
            return (f"{what} did not finish within {waited:.0f} s on the clock (it used "
                    f"{self.cpu_seconds():.1f} s of CPU): the server is overloaded")
        return None
