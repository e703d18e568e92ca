"""Builds the CPU kernels: one shared library per instruction-set level (radixserve/kernels/
levels.py), each an extension module that ``native.py`` loads with ctypes. Everything else
about the package is in pyproject.toml."""

from __future__ import annotations

import importlib.util
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.modified import newer_group

_HERE = Path(__file__).parent
_KERNELS = _HERE / "radixserve" / "kernels"
_spec = importlib.util.spec_from_file_location("_levels", _KERNELS / "levels.py")
levels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(levels)


class BuildKernels(build_ext):
    """Each level in its own temporary folder (they share sources, compiled with other flags),
    every level's sources compiled side by side on the machine's cores (one level's
    paged_attention.cpp alone takes ~25 s; one after another the five x86 levels took over
    three minutes on two cores), then each level linked. A level the compiler cannot build
    (an old g++ without AMX, say) is left out with a message; the loader then picks the best
    level that is there. ``RADIXSERVE_BUILD_LEVELS=avx2,generic`` (say) builds only those
    (levels.chosen_levels)."""

    def build_extensions(self) -> None:
        self.check_extensions_list(self.extensions)
        self._remove_unchosen()
        todo = [ext for ext in self.extensions
                if self.force or newer_group([*ext.sources, *ext.depends],
                                             self.get_ext_fullpath(ext.name), "newer")]
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            # source by source (levels.SOURCES: the longest first), every level of each
            jobs = {(ext.name, i): pool.submit(self._compile, ext, ext.sources[i])
                    for i in range(len(levels.SOURCES)) for ext in todo}
            for ext in todo:
                try:
                    self._link(ext, [jobs[ext.name, i].result()
                                     for i in range(len(ext.sources))])
                except Exception as exc:  # noqa: BLE001 (any compiler failure: leave it out)
                    print(f"radixserve: the {ext.name} kernels did not build and are left "
                          f"out: {exc}")

    def _remove_unchosen(self) -> None:
        """A level not chosen this time (RADIXSERVE_BUILD_LEVELS) must not ship from an earlier
        build's output: its library is removed from where this build puts its own."""
        chosen = {ext.name for ext in self.extensions}
        for level in levels.levels_for(platform.machine()):
            name = f"radixserve.kernels.{levels.library_stem(level)}"
            path = Path(self.get_ext_fullpath(name))
            if name not in chosen and path.exists():
                print(f"radixserve: {path.name} removed (not among RADIXSERVE_BUILD_LEVELS)")
                path.unlink()

    def _compile(self, ext: Extension, source: str) -> str:
        """One source of one level, into that level's temporary folder: its object file."""
        (obj,) = self.compiler.compile(
            [source], output_dir=os.path.join(self.build_temp, ext.name),
            macros=ext.define_macros, include_dirs=ext.include_dirs, debug=self.debug,
            extra_postargs=ext.extra_compile_args, depends=ext.depends)
        return obj

    def _link(self, ext: Extension, objects: list[str]) -> None:
        self.compiler.link_shared_object(
            objects, self.get_ext_fullpath(ext.name), libraries=self.get_libraries(ext),
            library_dirs=ext.library_dirs, runtime_library_dirs=ext.runtime_library_dirs,
            extra_postargs=ext.extra_link_args, export_symbols=self.get_export_symbols(ext),
            debug=self.debug, build_temp=os.path.join(self.build_temp, ext.name),
            target_lang=ext.language)


def _extensions() -> list[Extension]:
    sources = [str(Path("radixserve/kernels") / name) for name in levels.SOURCES]
    digest = levels.source_hash(_KERNELS)
    out = []
    try:
        chosen = levels.chosen_levels(platform.machine(),
                                      os.environ.get("RADIXSERVE_BUILD_LEVELS"))
    except ValueError as exc:
        raise SystemExit(f"radixserve: {exc}") from None
    for level, (flags, _needs) in chosen.items():
        out.append(Extension(
            f"radixserve.kernels.{levels.library_stem(level)}", sources=sources, language="c++",
            depends=[str(Path("radixserve/kernels") / h) for h in levels.HEADERS],
            extra_compile_args=[*levels.COMMON_FLAGS, *flags,
                                f'-DRS_SOURCE_HASH="{digest}"'],
            extra_link_args=["-fopenmp"]))
    return out


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildKernels})
