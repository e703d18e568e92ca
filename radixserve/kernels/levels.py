"""The instruction-set levels the CPU kernels are built for: compiler flags and the CPU
features each needs. Read by ``setup.py`` (which compiles one library per level) and by
``native.py`` (which loads the best one this CPU runs), so the two never disagree.

Plain data, no imports beyond the standard library: ``setup.py`` loads this file by path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# The longest to compile first: setup.py queues every level's compiles in this order, so the
# slowest (paged_attention.cpp's many specialisations: ~25 s a level, ~65 s at generic) start
# at once rather than last.
SOURCES = ("paged_attention.cpp", "block_linear.cpp", "half_linear.cpp", "int8_linear.cpp",
           "tile_linear.cpp", "layer_ops.cpp", "lora.cpp", "bitmask.cpp", "block_pack.cpp",
           "decoder_layer.cpp", "delta_rule.cpp", "ssd_scan.cpp")
HEADERS = ("simd.h", "half_linear.h", "scratch.h", "tile_linear.h", "tile_decode.h",
           "tile_simd.h", "packed_layout.h")

# Every level: optimised, no FMA contraction the source did not write (the kernels state their
# rounding), OpenMP (bound at run time to the libgomp torch loaded).
COMMON_FLAGS = ("-O3", "-g0", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-std=c++17",
                "-Wno-psabi")

_V3 = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm")  # x86-64-v3 in /proc/cpuinfo
_V4_VNNI = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni")

# name -> (compiler flags, CPU flags needed), best level first.
X86_LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "amx": (("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-int8",
             "-mamx-bf16"), (*_V4_VNNI, "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")),
    "avx512": (("-march=x86-64-v4", "-mavx512vnni"), _V4_VNNI),
    # AVX2 with the 256-bit VNNI dot products (Intel Alder Lake and later laptops and desktops,
    # which have no AVX-512; AMD Zen 5)
    "avxvnni": (("-march=x86-64-v3", "-mavxvnni"), (*_V3, "avx_vnni")),
    "avx2": (("-march=x86-64-v3",), _V3),
    "generic": (("-march=x86-64",), ()),
}
# aarch64: Armv8.2's int8 dot product (sdot; "asimddp" in /proc/cpuinfo's Features: Graviton 2
# and later, Ampere Altra, Apple M under Linux, Cortex-A76 and later), else the compiler's
# baseline (NEON).
ARM_LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "dotprod": (("-march=armv8.2-a+dotprod",), ("asimddp",)),
    "generic": ((), ()),
}
# Other architectures get the portable level only, with the compiler's baseline for the target.
OTHER_LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {"generic": ((), ())}


def levels_for(machine: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The levels built and loadable on ``platform.machine()`` == ``machine``."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64"):
        return X86_LEVELS
    return ARM_LEVELS if machine in ("aarch64", "arm64") else OTHER_LEVELS


def chosen_levels(machine: str, spec: str | None) -> dict[str, tuple[tuple[str, ...],
                                                                    tuple[str, ...]]]:
    """The levels to build: all of ``levels_for(machine)``, or those named in ``spec`` (the
    ``RADIXSERVE_BUILD_LEVELS`` environment variable of a source install: comma-separated, e.g.
    ``avx2`` to build only what an AVX2 machine runs, in a fraction of the time). A name this
    machine's architecture has no level of is a ValueError naming the ones it has."""
    known = levels_for(machine)
    if spec is None or not spec.strip():
        return known
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"RADIXSERVE_BUILD_LEVELS names {', '.join(unknown)}: the levels of "
                         f"{machine} are {', '.join(known)}")
    return {name: flags for name, flags in known.items() if name in names}


def library_stem(level: str) -> str:
    """The extension module name of a level's library (``radixserve.kernels.<stem>``)."""
    return f"_cpu_{level}"


def source_hash(folder: Path) -> str:
    """A short hash of the kernel sources and flags: compiled into each library, compared at
    load, so a library older than its sources (an edited checkout not rebuilt) is not used."""
    key = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        key.update((folder / name).read_bytes())
    key.update(" ".join(COMMON_FLAGS).encode())
    return key.hexdigest()[:16]
