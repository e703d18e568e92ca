"""Where ``radixserve serve`` spends its start-up, on request (``benchmarks/startup_profile.py``).

With ``RADIXSERVE_STARTUP_PROFILE=DIR`` in the environment each process of the server (the API
process, ``role`` "api"; the engine-core process, "engine") records

- marks: wall-clock instants (``time.time()``, comparable across the processes) of the steps
  the start-up code names with `mark`, beside the process's own creation time, and
- spans: a thread's named piece of work (`span`), with its start and end,

and runs its main thread under cProfile from `begin` to `end`, which writes
``DIR/<role>-<pid>.json`` (the marks and spans) and ``DIR/<role>-<pid>.prof`` (pstats). A
`span` with ``profile=True`` profiles its own thread into ``DIR/<role>-<name>-<pid>.prof``
(cProfile sees one thread only); ``RADIXSERVE_STARTUP_PROFILE_MARKS_ONLY=1`` leaves cProfile
off (the marks then time the phases at full speed). Without ``RADIXSERVE_STARTUP_PROFILE``
every call here is a no-op costing a test of an empty dict, and nothing is written.

Torch-free and import-light: the API process imports it before anything else loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator

ENV = "RADIXSERVE_STARTUP_PROFILE"
MARKS_ONLY = "RADIXSERVE_STARTUP_PROFILE_MARKS_ONLY"

_state: dict = {}  # role, folder, profiler, marks, spans, ended: set by begin
_lock = threading.Lock()


def begin(role: str) -> None:
    """Start recording this process as ``role`` (a no-op without `ENV`, or when already
    recording)."""
    folder = os.environ.get(ENV)
    if not folder or _state:
        return
    os.makedirs(folder, exist_ok=True)
    profiler = _profiler()
    _state.update(role=role, folder=folder, profiler=profiler, marks=[], spans=[])
    mark("begin")
    if profiler is not None:
        profiler.enable()


def mark(name: str) -> None:
    """Record that this process reached step ``name`` now."""
    if _state:
        with _lock:
            _state["marks"].append((name, time.time()))


@contextlib.contextmanager
def span(name: str, profile: bool = False) -> Iterator[None]:
    """Record the block as the work ``name`` of the calling thread; ``profile``: run it under
    its own cProfile (for work on a thread other than the main one)."""
    if not _state:
        yield
        return
    role, folder = _state["role"], _state["folder"]
    profiler = _profiler() if profile else None
    start = time.time()
    if profiler is not None:
        profiler.enable()
    try:
        yield
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(folder, f"{role}-{name}-{os.getpid()}.prof"))
        with _lock:
            _state["spans"].append((name, threading.current_thread().name, start, time.time()))
        if _state.get("ended"):  # finished after the main thread's end: written again
            _write()


def end() -> None:
    """Stop profiling the main thread and write this process's files (a no-op when not
    recording, or after the first call). Spans that finish later are still recorded: each
    rewrites the ``.json``."""
    if not _state or _state.get("ended"):
        return
    mark("end")
    profiler = _state["profiler"]
    _state["ended"] = True
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(_base() + ".prof")
    _write()


def _profiler():
    """A cProfile profiler, or None with ``RADIXSERVE_STARTUP_PROFILE_MARKS_ONLY=1`` (cProfile
    slows Python code down: the marks alone time the phases as they run unprofiled)."""
    if os.environ.get(MARKS_ONLY) == "1":
        return None
    import cProfile

    return cProfile.Profile()


def _base() -> str:
    return os.path.join(_state["folder"], f"{_state['role']}-{os.getpid()}")


def _write() -> None:
    with _lock:
        record = {"role": _state["role"], "pid": os.getpid(), "created": process_created(),
                  "marks": list(_state["marks"]), "spans": list(_state["spans"])}
    with open(_base() + ".json", "w") as f:
        json.dump(record, f, indent=1)


def process_created() -> float | None:
    """This process's creation time (``time.time()`` scale, to the kernel's clock tick), from
    /proc; None where there is none."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    # NOTE: the start is in ticks since boot (CLOCK_BOOTTIME); /proc/stat's btime is whole
    # seconds, too coarse to place it on the wall clock
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age
