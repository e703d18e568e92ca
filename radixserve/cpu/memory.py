"""The machine's memory as the engine and the model manager size their pools from."""

from __future__ import annotations


def mem_available() -> int:
    """The system's available memory in bytes (psutil, else /proc/meminfo's MemAvailable)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read the available memory (/proc/meminfo has no MemAvailable)")
