"""The aarch64 kernel levels (kernels/levels.py: ``dotprod``, ``generic``), cross-compiled and
run under qemu's user-mode emulator where this machine has both (Debian: g++-aarch64-linux-gnu,
qemu-user; skipped otherwise): every block format's linear and the 16-bit ones', through the
same C entry points the Python layer calls (cross/block_linear_main.cpp), on shapes that take
the single-row, register block, held and decoded paths, and every F16 subnormal widened alone,
must give this machine's generic level's bits exactly. Both
sides sum integers exactly and run the same float steps without fused multiply-adds
(-ffp-contract=off), so any difference is a fault in the aarch64 code (sdot's operands, a
vector cast, a lane order), not rounding; the x86 generic level itself is checked against the
dequantized weights in test_block_linear.py."""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_blocks import random_rows
from kquants import quantize

from radixserve.kernels import levels
from radixserve.kernels.tile_grids import table
from radixserve.layers.block_linear import FORMATS, HALF_TYPES, TILE_TYPES, pack

CXX, QEMU = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
KERNELS = Path(levels.__file__).parent
X86_GENERIC = sorted(glob.glob(str(KERNELS / "_cpu_generic.*so")))
pytestmark = pytest.mark.skipif(
    not (CXX and QEMU and X86_GENERIC),
    reason="needs aarch64-linux-gnu-g++, qemu-aarch64 and the x86 generic kernel library")

# what the block linear links (the decoder layer, attention and LoRA are not needed here)
SOURCES = ("block_linear.cpp", "block_pack.cpp", "half_linear.cpp", "int8_linear.cpp",
           "tile_linear.cpp")
SHAPES = [(40, 512, m) for m in (1, 3, 16, 70)]  # N: two groups, one part-filled


class BlockPart(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int64), ("packed", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("bias", ctypes.c_void_p)]


def _stored(qtype, w: np.ndarray, seed: int = 0) -> np.ndarray:
    """The bytes the harness takes: a block format's GGUF rows (a tile type's random ones: no
    quantizer here makes them), a 16-bit one's packed layout."""
    if qtype in TILE_TYPES:
        return random_rows(qtype, w.shape[0], w.shape[1], seed)
    if qtype in HALF_TYPES:
        half = torch.from_numpy(w).to(torch.float16 if qtype.name == "F16" else torch.bfloat16)
        raw = half.view(torch.uint8).reshape(w.shape[0], -1)
        return pack(qtype, raw, w.shape[1]).numpy()
    return np.ascontiguousarray(quantize(w, qtype), np.uint8)


def _cases(seed: int = 0) -> list[tuple[int, int, int, int, np.ndarray, np.ndarray]]:
    rng, cases = np.random.default_rng(seed), []
    for qtype in FORMATS:
        for n, k, m in SHAPES:
            raw = _stored(qtype, rng.standard_normal((n, k)).astype(np.float32))
            x = (rng.standard_normal((m, k)) * np.linspace(0.1, 3.0, k)).astype(np.float32)
            cases.append((FORMATS[qtype], n, k, m, raw, x))
    # every F16 subnormal and zero (both signs: 2,048) and 2,048 normals, each picked out alone
    # by an identity input: y = W.T, so every widening is compared, not a sum of them
    bits = np.concatenate([np.arange(1024, dtype=np.uint16), np.arange(1024, dtype=np.uint16) |
                           0x8000, rng.integers(0x0400, 0x7C00, 2048).astype(np.uint16)])
    w = torch.from_numpy(bits.view(np.int16).reshape(16, 256)).view(torch.float16).float()
    cases.append((FORMATS[HALF_TYPES[0]], 16, 256, 256, _stored(HALF_TYPES[0], w.numpy()),
                  np.eye(256, dtype=np.float32)))
    return cases


def _write_cases(cases, path: Path) -> None:
    with open(path, "wb") as f:
        f.write(np.int64(len(cases)).tobytes())
        for fmt, n, k, m, raw, x in cases:
            f.write(np.array([fmt, n, k, m, raw.size], np.int64).tobytes())
            f.write(raw.tobytes())
            f.write(x.tobytes())


def _x86_generic(cases) -> list[np.ndarray]:
    lib = ctypes.CDLL(X86_GENERIC[0])
    lib.rs_block_packed_bytes.restype = ctypes.c_int64
    lib.rs_block_packed_bytes.argtypes = [ctypes.c_int64] * 3
    lib.rs_init(0)
    lib.rs_tile_grids(table().ctypes.data_as(ctypes.c_void_p))
    outs = []
    for fmt, n, k, m, raw, x in cases:
        packed = np.zeros(lib.rs_block_packed_bytes(fmt, n, k), np.uint8)
        if fmt in (FORMATS[t] for t in HALF_TYPES):  # packed already (_stored)
            packed[:] = raw
        else:
            assert lib.rs_block_pack(ctypes.c_int64(fmt), raw.ctypes.data_as(ctypes.c_void_p),
                                     ctypes.c_int64(n), ctypes.c_int64(k),
                                     packed.ctypes.data_as(ctypes.c_void_p)) == 0
        part = BlockPart(fmt, packed.ctypes.data, n, None)
        y = np.zeros((m, n), np.float32)
        assert lib.rs_block_linear(x.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(m),
                                   ctypes.c_int64(k), ctypes.byref(part), ctypes.c_int64(1),
                                   y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n)) == 0
        outs.append(y)
    return outs


def _build(level: str, out: Path) -> Path:
    """The harness linked with `level`'s aarch64 objects, statically (no sysroot at run time)."""
    flags = [*levels.COMMON_FLAGS, *levels.ARM_LEVELS[level][0], "-fPIC", "-DRS_SOURCE_HASH=\"x\""]
    out.mkdir(parents=True, exist_ok=True)
    srcs = [KERNELS / s for s in SOURCES] + [Path(__file__).parent / "cross/block_linear_main.cpp"]

    def compile_one(src: Path) -> Path:
        obj = out / (src.stem + ".o")
        subprocess.run([CXX, *flags, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, srcs))
    exe = out / "block_linear_main"
    subprocess.run([CXX, "-static", "-fopenmp", *map(str, objs), "-o", str(exe)], check=True)
    return exe


@pytest.mark.parametrize("level", list(levels.ARM_LEVELS))
def test_aarch64_level_gives_the_x86_generic_bits(level, tmp_path):
    cases = _cases()
    _write_cases(cases, tmp_path / "cases.bin")
    table().tofile(tmp_path / "grids.bin")
    exe = _build(level, tmp_path / level)
    run = subprocess.run([QEMU, "-cpu", "max", str(exe), str(tmp_path / "cases.bin"),
                          str(tmp_path / "out.bin"), str(tmp_path / "grids.bin")], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "2"}, timeout=600)
    assert run.returncode == 0, run.stderr
    assert f"level {level}" in run.stderr  # the level's code, not a silent fallback
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    want = _x86_generic(cases)
    at = 0
    for (fmt, n, k, m, _, _), ref in zip(cases, want):
        y = got[at:at + m * n].reshape(m, n)
        at += m * n
        assert torch.equal(torch.from_numpy(y), torch.from_numpy(ref)), (level, fmt, n, k, m)
    assert at == got.size
