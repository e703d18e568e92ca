"""Builds the CPU kernels: one shared library per instruction-set level (radixserve/kernels/
levels.py), each an extension module that ``native.py`` loads with ctypes. Everything else
about the package is in pyproject.toml."""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_HERE = Path(__file__).parent
_KERNELS = _HERE / "radixserve" / "kernels"
_spec = importlib.util.spec_from_file_location("_levels", _KERNELS / "levels.py")
levels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(levels)


class BuildKernels(build_ext):
    """Each level in its own temporary folder (they share sources, compiled with other flags).
    A level the compiler cannot build (an old g++ without AMX, say) is left out with a
    message; the loader then picks the best level that is there."""

    def build_extension(self, ext: Extension) -> None:
        temp = self.build_temp
        self.build_temp = os.path.join(temp, ext.name)
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 (any compiler failure: leave this level out)
            print(f"radixserve: the {ext.name} kernels did not build and are left out: {exc}")
        finally:
            self.build_temp = temp


def _extensions() -> list[Extension]:
    sources = [str(Path("radixserve/kernels") / name) for name in levels.SOURCES]
    digest = levels.source_hash(_KERNELS)
    out = []
    for level, (flags, _needs) in levels.levels_for(platform.machine()).items():
        out.append(Extension(
            f"radixserve.kernels.{levels.library_stem(level)}", sources=sources, language="c++",
            depends=[str(Path("radixserve/kernels") / h) for h in levels.HEADERS],
            extra_compile_args=[*levels.COMMON_FLAGS, *flags,
                                f'-DRS_SOURCE_HASH="{digest}"'],
            extra_link_args=["-fopenmp"]))
    return out


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildKernels})
