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


def _malloc_trim():
    import ctypes
    import ctypes.util

    for name in ("libc.so.6", ctypes.util.find_library("c")):
        try:
            return ctypes.CDLL(name).malloc_trim if name else None
        except (OSError, AttributeError):  # not glibc (musl, macOS)
            continue
    return None


_TRIM = _malloc_trim()


def trim_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim(0)``: every arena,
    holes in the middle included; glibc keeps them for reuse otherwise). A no-op off glibc.
    Called after a build that frees much of what it allocated (a model's load, a tokenizer's
    tables) and after large requests."""
    if _TRIM is not None:
        _TRIM(0)
