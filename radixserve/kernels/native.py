"""Load the CPU kernel library for the best instruction-set level this CPU runs.

The kernels are plain C++ with an ``extern "C"`` interface, compiled at install time by the
package build (``setup.py``) into one shared library per level (``levels.py``: amx, avx512,
avx2, generic) and called through ``ctypes`` (which releases the GIL for the call). Nothing is
compiled at run time. OpenMP inside the kernels links by soname to the ``libgomp`` torch has
already loaded, so they share torch's thread pool and ``torch.set_num_threads``.

``load()`` picks the best level whose CPU features ``/proc/cpuinfo`` lists (or the level that
``RADIXSERVE_CPU_ISA`` names: ``UnsupportedLevel`` if this CPU cannot run it or it was not
built), checks that the library was built from these sources, logs the choice once, and returns
the library. Where no library can be used (not built, stale, failed to load) it logs a WARNING
naming what runs instead (the torch paths) and returns None; ``RADIXSERVE_NATIVE_KERNELS=0``
turns the kernels off on purpose. ``describe()`` reports all of it for ``radixserve env``.
The kernels themselves are called through ``ops.py`` only (it checks their arguments).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
import platform
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from radixserve.kernels import levels as _levels

logger = logging.getLogger(__name__)

ABI_VERSION = 20  # 9: F16 / BF16 parts in rs_block_linear; 10: + attention window, softcap;
# 11: + rs_decoder_attention, rs_decoder_mlp (the layer in two halves, for tensor parallel);
# 12: Gemma and q/k norms in the native decoder layer; 13: rs_block_pack (the repack at load);
# 14: rs_lora_shrink, rs_lora_expand; 15: rs_held_kquants; 16: the tile formats (Q2_K, Q3_K,
# IQ*, MXFP4, TQ*: tile_linear.cpp) and rs_tile_grids; 17: rs_causal_conv, rs_gated_delta_rule
# (delta_rule.cpp); 18: rs_causal_conv's bias and activation, rs_ssd_scan and rs_gated_rms_norm
# (ssd_scan.cpp); 19: rs_paged_attention's sinks (gpt-oss); 20: its row positions (a row's
# window counted back from its position, its limit past it: Gemma 3's image rows)
ISA_ENV = "RADIXSERVE_CPU_ISA"

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "rs_abi_version": (ctypes.c_int, []),
    "rs_level": (ctypes.c_char_p, []),
    "rs_source_hash": (ctypes.c_char_p, []),
    "rs_init": (ctypes.c_int, [ctypes.c_int]),
    "rs_held_kquants": (ctypes.c_int, [ctypes.c_int]),
    "rs_tile_grids": (None, [_P]),
    "rs_int8_pack": (None, [_P, _I64, _I64, _P, _P]),
    "rs_int8_linear": (ctypes.c_int, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _P, _I64]),
    "rs_block_packed_bytes": (_I64, [_I64, _I64, _I64]),
    "rs_block_linear": (ctypes.c_int, [_P, _I64, _I64, _P, _I64, _P, _I64]),
    "rs_block_pack": (ctypes.c_int, [_I64, _P, _I64, _I64, _P]),
    "rs_paged_attention": (ctypes.c_int, [_P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _I64, _P,
                                          _I64, _P, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                          ctypes.c_float, _I64, ctypes.c_float, _P, _P]),
    "rs_rms_norm": (None, [_P, _I64, _P, _I64, _I64, ctypes.c_float, _P, _I64]),
    "rs_add_rms_norm": (None, [_P, _P, _P, _I64, _I64, ctypes.c_float, _P]),
    "rs_rotary": (None, [_P, _I64, _I64, _P, _I64, _I64, _I64, _I64, _P, _P, _P]),
    "rs_silu_mul": (None, [_P, _I64, _I64, _P]),
    "rs_gelu_tanh_mul": (None, [_P, _I64, _I64, _P]),
    "rs_head_rms_norm": (None, [_P, _I64, _P, _I64, _I64, _I64, ctypes.c_float, _P, _I64]),
    "rs_decoder_layer": (ctypes.c_int, [_P, _P, ctypes.c_int]),
    "rs_decoder_attention": (ctypes.c_int, [_P, _P, ctypes.c_int]),
    "rs_decoder_mlp": (ctypes.c_int, [_P, _P]),
    "rs_apply_bitmask": (None, [_P, _I64, _P, _I64, _P, _I64, _I64]),
    "rs_lora_shrink": (None, [_P, _I64, _I64, _I64, _P, _P, _P, _I64, _P, _I64]),
    "rs_lora_expand": (None, [_P, _I64, _I64, _I64, _P, _P, _P, _P, _I64, _P, _I64]),
    "rs_causal_conv": (ctypes.c_int, [_P, _I64, _I64, _P, _I64, _P, ctypes.c_int, _P, _I64, _P,
                                      _P, _I64, _P, _I64, _P]),
    "rs_gdn_gates": (None, [_P, _I64, _P, _I64, _P, _P, _I64, _I64, _P, _P]),
    "rs_sigmoid_mul": (None, [_P, _P, _I64, _I64, _I64, _P]),
    "rs_gated_delta_rule": (ctypes.c_int, [_P, _I64, _P, _I64, _P, _I64, _P, _P, _I64, _I64,
                                           _I64, _I64, _I64, _P, _I64, _P, _P, _I64, _P, _I64,
                                           _P]),
    "rs_ssd_scan": (ctypes.c_int, [_P, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _P, _P,
                                   ctypes.c_float, ctypes.c_float, _I64, _I64, _I64, _I64, _I64,
                                   _P, _I64, _P, _P, _I64, _P, _I64, _P]),
    "rs_gated_rms_norm": (None, [_P, _P, _I64, _P, _I64, _I64, _I64, ctypes.c_float, _P]),
}


class UnsupportedLevel(ValueError):
    """``RADIXSERVE_CPU_ISA`` names a level this CPU cannot run, or one not built here."""


@dataclass(frozen=True)
class KernelInfo:
    """What ``load()`` chose and why: plain data for ``radixserve env`` and the start-up line."""

    level: str | None  # the loaded level, None where the torch paths run
    path: str | None
    amx_tiles: bool
    runnable: tuple[str, ...]  # levels this CPU runs, best first
    built: tuple[str, ...]  # levels whose library is installed
    reason: str  # one line: why this level, or why none
    cpu_flags: tuple[str, ...] = field(default=())  # the CPU features the levels ask about
    # Q4_K / Q5_K codes held in registers at every row count, never decoded (AMD Zen 4's
    # AVX-512: block_linear.cpp zen4())
    held_kquants: bool = False

    @property
    def tuning(self) -> str:
        """The per-core choices inside the level, for the start-up line and ``radixserve env``
        ('' where none applies)."""
        return ("K-quant GEMM: Q4_K / Q5_K codes held in registers at every row count "
                "(AMD Zen 4)" if self.held_kquants else "")


def load() -> ctypes.CDLL | None:
    """The kernel library of the chosen level; None where none can be used (logged once, a
    WARNING unless turned off on purpose). Raises ``UnsupportedLevel`` for a forced level this
    CPU cannot run or that is not installed."""
    return _load_and_describe()[0]


def describe() -> KernelInfo:
    """What ``load()`` chose (loading it if not yet)."""
    return _load_and_describe()[1]


def reset() -> None:
    """Forget the choice, so the next ``load()`` chooses again as a new process would (tests)."""
    _load_and_describe.cache_clear()


@cache
def _load_and_describe() -> tuple[ctypes.CDLL | None, KernelInfo]:
    flags = cpu_flags()
    table = _levels.levels_for(platform.machine())
    runnable = tuple(name for name, (_, needs) in table.items() if all(f in flags for f in needs))
    built = tuple(name for name in table if library_path(name) is not None)
    asked = {f for _, needs in table.values() for f in needs}
    info = dict(runnable=runnable, built=built, cpu_flags=tuple(sorted(asked & flags)))
    if os.environ.get("RADIXSERVE_NATIVE_KERNELS", "1") == "0":
        reason = "RADIXSERVE_NATIVE_KERNELS=0: the torch paths run"
        logger.info("native CPU kernels off (%s)", reason)
        return None, KernelInfo(None, None, False, reason=reason, **info)
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced:
        if forced not in table:
            raise UnsupportedLevel(f"{ISA_ENV}={forced!r} is not a level of this machine; "
                                   f"levels: {', '.join(table)}")
        if forced not in runnable:
            missing = [f for f in table[forced][1] if f not in flags]
            raise UnsupportedLevel(f"{ISA_ENV}={forced}: this CPU lacks {', '.join(missing)}; "
                                   f"it runs {', '.join(runnable)}")
        if forced not in built:
            raise UnsupportedLevel(f"{ISA_ENV}={forced}: that level's kernel library is not "
                                   f"installed (built: {', '.join(built) or 'none'})")
        candidates, why = [forced], f"forced by {ISA_ENV}"
    else:
        candidates = [name for name in runnable if name in built]
        why = "the best level this CPU runs"
        if runnable and candidates and candidates[0] != runnable[0]:
            why = f"the best level installed ({runnable[0]} is not built)"
    errors = []
    for level in candidates:
        try:
            lib = _open(level)
        except (OSError, AttributeError, _Stale) as exc:
            errors.append(f"{level}: {exc}")
            continue
        amx = bool(lib.rs_init(1)) if level == "amx" else False
        path = str(library_path(level))
        chosen = KernelInfo(level, path, amx, reason=why, **info,
                            held_kquants=bool(lib.rs_held_kquants(-1)))
        logger.info("native CPU kernels: %s (%s%s%s), %s", level, why,
                    ", AMX tiles" if amx else "",
                    f"; {chosen.tuning}" if chosen.tuning else "", path)
        if errors:
            logger.warning("native CPU kernels: better levels failed to load: %s",
                           "; ".join(errors))
        return lib, chosen
    reason = ("; ".join(errors) if errors else
              "no kernel library is installed (build the package: pip install .)")
    logger.warning("native CPU kernels unavailable (%s); the torch paths run instead (float "
                   "weights, torch attention)", reason)
    return None, KernelInfo(None, None, False, reason=reason, **info)


class _Stale(Exception):
    pass


def library_path(level: str) -> Path | None:
    """The installed library of ``level`` (an extension module file next to this one)."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{_levels.library_stem(level)}{suffix}"
        if path.is_file():
            return path
    return None


def _open(level: str) -> ctypes.CDLL:
    import torch  # noqa: F401  (its libgomp must be loaded before ours resolves it)

    path = library_path(level)
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.rs_abi_version() != ABI_VERSION:
        raise _Stale(f"{path.name} has interface {lib.rs_abi_version()}, not {ABI_VERSION}: "
                     "rebuild (pip install .)")
    built_from = lib.rs_source_hash().decode()
    if built_from != _levels.source_hash(Path(__file__).parent):
        raise _Stale(f"{path.name} was built from other sources: rebuild (pip install .)")
    if lib.rs_level().decode() != level:
        raise _Stale(f"{path.name} is a {lib.rs_level().decode()} build")
    from radixserve.kernels.tile_grids import table

    lib.rs_tile_grids(table().ctypes.data)  # the IQ types' codebooks, copied by the library
    return lib


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
