"""The package build compiles the CPU kernels: a wheel built from this tree, installed in a
fresh venv, loads the best level of this CPU with no compiler on PATH (nothing is compiled at
run time)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from radixserve.kernels import native

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, shutil
from radixserve.kernels import native
info = native.describe()
print(json.dumps({"file": native.__file__, "level": info.level, "built": info.built,
                  "gxx": shutil.which("g++") or shutil.which("c++") or shutil.which("cc")}))
"""


def _tracked(tmp_path: Path) -> Path:
    """A copy of the tracked files only: no kernels built in place, no earlier build's output."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True,
                           text=True).stdout.split()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    return src


@pytest.mark.slow
def test_an_installed_wheel_loads_its_kernels_without_a_compiler(tmp_path):
    """Built for this CPU's best level only (RADIXSERVE_BUILD_LEVELS): every level is compiled
    by the suite's own editable install, and one level builds in a quarter of the time."""
    if shutil.which("g++") is None:
        pytest.skip("no compiler here to build the wheel with")
    best = native.describe().runnable[0]
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(_tracked(tmp_path))], check=True,
                   capture_output=True, timeout=900,
                   env={**os.environ, "RADIXSERVE_BUILD_LEVELS": best})
    (wheel,) = wheels.glob("radixserve-*.whl")
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    # The wheel's own files in the fresh venv; its dependencies (torch...) from this one's
    # site-packages, added after it (a .pth there does not run this venv's editable finder).
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": str(tmp_path / "no-compilers-here"), "HOME": str(tmp_path)}
    env.update({k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")})
    done = subprocess.run([str(python), "-c", _PROBE], cwd=tmp_path, env=env, check=True,
                          capture_output=True, text=True, timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(site)) and found["gxx"] is None
    assert found["level"] == best and found["built"] == [best]


def test_build_levels_are_all_or_the_named_ones_and_an_unknown_name_is_refused():
    levels = native._levels
    assert levels.chosen_levels("x86_64", None) == levels.X86_LEVELS
    assert levels.chosen_levels("x86_64", " ") == levels.X86_LEVELS
    assert list(levels.chosen_levels("x86_64", "generic, AVX2")) == ["avx2", "generic"]
    assert list(levels.chosen_levels("aarch64", "dotprod")) == ["dotprod"]
    with pytest.raises(ValueError, match=r"names avx9: the levels of aarch64 are dotprod, "
                                         r"generic"):
        levels.chosen_levels("aarch64", "avx9,generic")


def test_a_wheel_built_without_a_compiler_installs_and_runs_the_torch_path(tmp_path):
    # the tracked sources only (no kernels built in place), every compiler a failing stub
    src = _tracked(tmp_path)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for compiler in ("gcc", "g++", "cc", "c++"):
        (stubs / compiler).symlink_to(shutil.which("false"))
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "CC": str(stubs / "gcc"),
           "CXX": str(stubs / "g++")}
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                            "--no-build-isolation", "-w", str(wheels), str(src)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "kernels did not build and are left out" in built.stdout + built.stderr
    (wheel,) = wheels.glob("radixserve-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)
    assert not list(site.rglob("*.so"))
    probe = ("import logging; logging.basicConfig(level=logging.WARNING)\n" + _PROBE)
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                          text=True, timeout=300)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(site)) and found["level"] is None
    assert "WARNING" in done.stderr and "the torch paths run instead" in done.stderr
