"""Build and load the CPU kernels in this folder: compiled once per machine, then cached.

The kernels are plain C++ with an ``extern "C"`` interface, compiled by the system's g++ into a
shared library and called through ``ctypes`` (which releases the GIL for the call). No torch
headers: the build takes ~2 s, not the ~50 s of a torch C++ extension. OpenMP inside the
kernels links by soname to the ``libgomp`` torch has already loaded, so they share torch's
thread pool and ``torch.set_num_threads``.

The library lands in ``$RADIXSERVE_CACHE_DIR/kernels`` (default ``~/.cache/radixserve/kernels``)
under a name keyed by the source, the compiler and the CPU's flags; it is written to a temporary
file and renamed, so concurrent processes do not see half a library. ``load()`` returns None
(and says why once, in the log) where the kernels cannot run: no g++, a CPU without AVX-512
VNNI, a failed build, or ``RADIXSERVE_NATIVE_KERNELS=0``. Callers then keep their torch path.
``RADIXSERVE_AMX=0`` keeps the kernels off AMX tiles (results are the same bits either way).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

ABI_VERSION = 5
_SOURCES = ("int8_linear.cpp", "q4_linear.cpp", "paged_attention.cpp", "layer_ops.cpp",
            "bitmask.cpp", "decoder_layer.cpp")
_HEADERS = ("simd.h",)
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
          "-shared", "-fPIC", "-std=c++17"]
_NEEDED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "rs_abi_version": (ctypes.c_int, []),
    "rs_init": (ctypes.c_int, [ctypes.c_int]),
    "rs_int8_pack": (None, [_P, _I64, _I64, _P, _P]),
    "rs_int8_linear": (ctypes.c_int, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _P, _I64]),
    "rs_q4_pack": (None, [_P, _P, _P, _I64, _I64, _P]),
    "rs_q4_linear": (ctypes.c_int, [_P, _I64, _I64, _P, _P, _I64, _P, _I64]),
    "rs_paged_attention": (ctypes.c_int, [_P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _I64, _P,
                                          _P, _I64, _I64, _I64, _I64, _I64, ctypes.c_float, _P]),
    "rs_rms_norm": (None, [_P, _I64, _P, _I64, _I64, ctypes.c_float, _P, _I64]),
    "rs_add_rms_norm": (None, [_P, _P, _P, _I64, _I64, ctypes.c_float, _P]),
    "rs_rotary": (None, [_P, _I64, _I64, _P, _I64, _I64, _I64, _I64, _P, _P, _P]),
    "rs_silu_mul": (None, [_P, _I64, _I64, _P]),
    "rs_decoder_layer": (ctypes.c_int, [_P, _P, ctypes.c_int]),
    "rs_apply_bitmask": (None, [_P, _I64, _P, _I64, _P, _I64, _I64]),
}


def cache_dir() -> Path:
    root = os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve"
    return Path(root) / "kernels"


@cache
def load() -> ctypes.CDLL | None:
    """The kernel library, built on first use; None where it cannot run here (logged once)."""
    if os.environ.get("RADIXSERVE_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        return _load()
    except (_Unavailable, OSError, AttributeError) as exc:  # OSError: unwritable cache, bad .so
        logger.info("native CPU kernels unavailable (%s); using the torch path", exc)
        return None


class _Unavailable(Exception):
    pass


def _load() -> ctypes.CDLL:
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    flags = _cpu_flags()
    missing = [f for f in _NEEDED_CPU_FLAGS if f not in flags]
    if missing:
        raise _Unavailable(f"CPU lacks {', '.join(missing)}")
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise _Unavailable("no C++ compiler (g++) on PATH")
    here = Path(__file__).parent
    sources = [here / name for name in _SOURCES]
    key = hashlib.sha256()
    for path in [*sources, *(here / name for name in _HEADERS)]:
        key.update(path.read_bytes())
    key.update(" ".join(_FLAGS).encode())
    key.update(_compiler_version(compiler).encode())
    key.update(" ".join(sorted(flags)).encode())
    target = cache_dir() / f"radixserve_cpu_{key.hexdigest()[:16]}.so"
    if not target.exists():
        _build(compiler, sources, target)
    lib = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.rs_abi_version() != ABI_VERSION:
        raise _Unavailable(f"{target} has another interface version")
    want_amx = os.environ.get("RADIXSERVE_AMX", "1") != "0"
    logger.info("native CPU kernels loaded (AMX %s)", "on" if lib.rs_init(want_amx) else "off")
    return lib


def _build(compiler: str, sources: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *_FLAGS, *map(str, sources), "-o", tmp]
    logger.info("building the native CPU kernels: %s", " ".join(cmd))
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise _Unavailable(f"build failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unavailable(f"build failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], check=False, capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unavailable(f"cannot run {compiler}: {exc}") from exc


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
