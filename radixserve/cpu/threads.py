"""How many CPU threads the engine may use: the CPUs this process may run on.

That is the smaller of the affinity mask (``taskset``, a cpuset) and the cgroup CPU quota (a
container given 2 of the host's 64 cores gets 2, not 64), unless ``--threads N`` says
otherwise. The engine process gives that many threads to torch, whose OpenMP pool the native
kernels share (they link the same ``libgomp``), and exports ``OMP_NUM_THREADS`` for anything it
starts. The API process does no tensor work: it keeps numpy's OpenBLAS pool, which would
otherwise start one thread per host core at import, at one thread.

Torch-free on purpose: the API process imports this module and must not load torch.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")

_applied: int | None = None  # the thread count the last apply_engine_threads set


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where there is no mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux, or the call failed
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(cgroup_root: Path = CGROUP_ROOT,
                     proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The cgroup CPU quota in whole CPUs (rounded up, at least 1), or None for no limit.

    cgroup v2 reads ``cpu.max`` ("max 100000": none; "200000 100000": 2 CPUs), cgroup v1
    ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (quota -1: none). Each is looked for
    in this process's own cgroup (from ``/proc/self/cgroup``) and every folder above it up to
    ``cgroup_root`` (a container usually has its own cgroup mounted there); the kernel enforces
    every ancestor's quota, so the smallest found applies. A missing or unreadable file, or
    one that does not parse, counts as no limit: this never raises.
    """
    v2_path, v1_path = _own_cgroup_paths(proc_cgroup)
    limits = []
    for folder in _ancestors(cgroup_root, v2_path):
        limits.append(_v2_limit(folder / "cpu.max"))
    for controller in ("cpu", "cpu,cpuacct"):
        for folder in _ancestors(cgroup_root / controller, v1_path):
            limits.append(_v1_limit(folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"))
    found = [n for n in limits if n is not None]
    return min(found) if found else None


def available_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The CPUs this process may use: min(affinity mask, cgroup quota), at least 1."""
    quota = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    cpus = affinity_cpus()
    return cpus if quota is None else max(1, min(cpus, quota))


def check_threads(requested) -> int | None:
    """``requested`` if it is None or an int >= 1; ValueError otherwise."""
    if requested is None:
        return None
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"threads must be an integer >= 1, got {requested!r}")
    return requested


def engine_threads(requested: int | None) -> int:
    """The engine's thread count: ``requested`` if given (>= 1), else ``available_cpus()``."""
    requested = check_threads(requested)
    return available_cpus() if requested is None else requested


def export_engine_threads(requested: int | None) -> int:
    """The engine's thread count (`engine_threads`), exported as ``OMP_NUM_THREADS`` (read by
    libgomp when it loads: set it before torch is imported) with numpy's OpenBLAS at one
    thread unless ``OPENBLAS_NUM_THREADS`` is set; `apply_engine_threads`'s first half, for a
    process that loads torch before its build applies the rest."""
    n = engine_threads(requested)
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return n


def apply_engine_threads(requested: int | None) -> int:
    """Size the engine process's thread pools; call it before the model is built (best before
    torch is imported: ``libgomp`` reads ``OMP_NUM_THREADS`` when it loads, and that is the
    count threads other than the caller start with). Sets torch's intra-op threads, exports
    ``OMP_NUM_THREADS`` (for children, and for libgomp if not yet loaded), keeps numpy's
    OpenBLAS at one thread unless ``OPENBLAS_NUM_THREADS`` is set (the engine runs no numpy
    BLAS; its pool would only compete with torch's), and logs the decision once. Returns the
    thread count."""
    global _applied
    n = export_engine_threads(requested)
    import torch

    if _applied == n and torch.get_num_threads() == n:
        return n
    torch.set_num_threads(n)
    _applied = n
    quota = cgroup_cpu_limit()
    logger.info("threads: %d (affinity %d, cgroup quota %s, requested %s)", n, affinity_cpus(),
                "none" if quota is None else quota,
                "none" if requested is None else requested)
    return n


def limit_api_threads() -> None:
    """For the API process, before numpy is imported (the tokenizer's GGUF reader imports it):
    OpenBLAS would start a thread per host core at import, for an API process that runs no
    BLAS. A value the user set is kept. The engine process inherits it (see
    ``apply_engine_threads``)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


BACKGROUND_NICE = 10
"""The nice value of grammar work. Measured beside 8 running streams of the embedded model
(benchmarks/structured_pathological.py, quiet machine): a 2,000-branch anyOf answered in
0.7 s / 1.5 s / 3.4 s / 21 s at nice 0 / 5 / 10 / 19, while the streams' p99 inter-token gap
during the pathological specs was 407 / 170 / 72 / 44 ms (p99 24-33 ms without them)."""


def background_priority() -> None:
    """Run the calling thread at a lower CPU priority (`BACKGROUND_NICE`; on Linux nice
    applies per thread), for work that must not stall the decode of running streams:
    compiling and checking grammars. A 2,000-branch schema is about 0.2 s of CPU in the API
    process and again in the engine; on cores the forward keeps busy it stretched every
    stream's step by that much. Niced, it mostly takes the cycles the forward leaves; its time
    limits count CPU seconds, so a slower wall clock does not fail it. Thread pools use this
    as their ``initializer``; elsewhere a no-op."""
    try:
        tid = threading.get_native_id()  # never raised: a niced server stays as niced
        os.setpriority(os.PRIO_PROCESS, tid,
                       max(BACKGROUND_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError):  # no setpriority, or not allowed: run as is
        pass


# -- cgroup files ----------------------------------------------------------------------------

def _own_cgroup_paths(proc_cgroup: Path) -> tuple[str, str]:
    """This process's cgroup v2 path (the "0::/path" line) and its v1 cpu controller's path,
    "/" where not found."""
    v2 = v1 = "/"
    try:
        lines = proc_cgroup.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return v2, v1
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(root: Path, cgroup_path: str) -> list[Path]:
    """root/cgroup_path, then each folder above it, down to root itself."""
    parts = [p for p in cgroup_path.strip().split("/") if p]
    if any(p in (".", "..") for p in parts):
        parts = []
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _whole_cpus(quota: int, period: int) -> int | None:
    if quota <= 0 or period <= 0:
        return None
    return max(1, -(-quota // period))


def _v2_limit(cpu_max: Path) -> int | None:
    text = _read(cpu_max)
    if text is None:
        return None
    fields = text.split()
    if not fields or fields[0] == "max" or len(fields) > 2:
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) == 2 else 100_000
    except ValueError:
        return None
    return _whole_cpus(quota, period)


def _v1_limit(quota_file: Path, period_file: Path) -> int | None:
    quota, period = _read(quota_file), _read(period_file)
    if quota is None or period is None:
        return None
    try:
        return _whole_cpus(int(quota), int(period))
    except ValueError:
        return None
