"""The GGUF block kernel at real sizes against the machine's limits, per CPU level.

Batch 1 (GEMV) is bound by memory: each weight byte is read once a step. This measures the read
bandwidth (a 2 GB float32 ``torch.sum`` on the same threads) and then, per level and file type,
a set of matrices of a 3B model's shapes (3072 x 8192 and 8192 x 3072, random valid blocks, more
bytes than the last-level cache) multiplied by 1, 16 and 128 rows: GB/s of weights read and the
share of the bandwidth at 1 row, GMAC/s (multiply-adds) at more rows. A shared host's bandwidth
swings by half from one minute to the next (AMD EPYC under KVM: 32 to 58 GB/s), so each 1-row
repetition comes right after a probe of its own (a 1 GB ``torch.sum``): the share is the median
over the repetitions of the pass's GB/s over its probe's, printed with the probes' median.

    .venv/bin/python benchmarks/bench_gemv.py [--levels amx,avx2] [--types Q4_K,Q8_0]
        [--rows 1,16,128] [--gb 1.5] [--threads 2] [--against OTHER.so --reps 7]

``--against`` times a second build of the same level (a copy of an earlier commit's library,
say) on the same matrices and inputs, the two called in turn every repetition, so a shared
machine's swings hit both alike: each cell is then this build's and the other's best GB/s or
GMAC/s over the repetitions (their medians after), and whether every output is bit-identical.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf import random_blocks  # noqa: E402

from radixserve.kernels import native  # noqa: E402
from radixserve.layers.block_linear import BlockLinear  # noqa: E402

_T = gguf.GGMLQuantizationType
SHAPES = [(8192, 3072), (3072, 8192)]  # a 3B layer's gate/up and down


def read_bandwidth() -> float:
    x = torch.ones(512 << 20, dtype=torch.float32)  # 2 GiB
    x.sum()
    t = time.perf_counter()
    for _ in range(5):
        x.sum()
    return x.numel() * 4 * 5 / (time.perf_counter() - t) / 1e9


def probe(buf: torch.Tensor) -> float:
    """The read bandwidth now: one float32 sum over ``buf`` (1 GB), GB/s."""
    t = time.perf_counter()
    buf.sum()
    return buf.numel() * 4 / (time.perf_counter() - t) / 1e9


def matrices(kind: str, gb: float) -> list[tuple[BlockLinear, int, int]]:
    rng = np.random.default_rng(0)
    out, total = [], 0.0
    while total < gb * 1e9:
        n, k = SHAPES[len(out) % 2]
        if kind in ("F16", "BF16"):
            half = torch.randn(n, k).to(torch.float16 if kind == "F16" else torch.bfloat16)
            raw = half.view(torch.uint8).reshape(n, 2 * k)
        else:
            raw = torch.from_numpy(random_blocks(rng, kind, n, k))
        layer = BlockLinear.from_stored([(_T[kind], raw)], k)
        out.append((layer, n, k))
        total += raw.numel()
    return out


def time_rows(layers, rows: int, reps: int, buf: torch.Tensor | None = None
              ) -> list[tuple[float, float]]:
    """``reps`` passes over ``layers``: each pass's seconds, after a bandwidth probe of ``buf``
    where given (its GB/s; else 0)."""
    xs = {k: torch.randn(rows, k) for _, _, k in layers}
    for layer, _, k in layers:
        layer(xs[k])
    out = []
    for _ in range(reps):
        bw = probe(buf) if buf is not None else 0.0
        t = time.perf_counter()
        for layer, _, k in layers:
            layer(xs[k])
        out.append((bw, time.perf_counter() - t))
    return out


def other_build(path: str):
    """``rs_block_linear`` of another build of this level (through a copy: the loader keeps one
    library per file name)."""
    copy = Path(tempfile.mkdtemp()) / Path(path).name
    shutil.copy(path, copy)
    lib = ctypes.CDLL(str(copy))
    fn = lib.rs_block_linear
    fn.restype, fn.argtypes = native._SIGNATURES["rs_block_linear"]
    if hasattr(lib, "rs_init"):
        lib.rs_init(1)
    return fn


def time_pair(layers, rows: int, reps: int, other, buf: torch.Tensor | None = None
              ) -> tuple[list[float], list[float], list[float], bool]:
    """Each repetition a bandwidth probe of ``buf`` where given, one pass over ``layers`` by this
    build, then one by ``other``: the probes' GB/s, the two builds' times, and whether all
    outputs agreed bit for bit."""
    xs = {k: torch.randn(rows, k) for _, _, k in layers}
    probes, ours, theirs, same = [], [], [], True
    for _ in range(reps):
        probes.append(probe(buf) if buf is not None else 0.0)
        t = time.perf_counter()
        mine = [layer(xs[k]) for layer, _, k in layers]
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        outs = []
        for layer, n, k in layers:
            w = layer._native
            y = torch.empty(rows, n)
            if other(xs[k].data_ptr(), rows, k, w.parts, len(w.parts), y.data_ptr(), n):
                raise MemoryError("the other build's scratch allocation failed")
            outs.append(y)
        theirs.append(time.perf_counter() - t)
        same &= all(torch.equal(a, b) for a, b in zip(mine, outs))
    return probes, ours, theirs, same


def _share(work: float, probes: list[float], times: list[float]) -> str:
    """The median over repetitions of a pass's GB/s over the probe's just before it."""
    return f"{statistics.median(work / t / 1e9 / p for p, t in zip(probes, times)):.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    info = native.describe()
    ap.add_argument("--levels", default=",".join(lv for lv in info.runnable if lv in info.built))
    ap.add_argument("--types", default="Q4_K,Q4_0,Q5_K,Q6_K,Q8_0,F16,BF16")
    ap.add_argument("--rows", default="1,16,128")
    ap.add_argument("--gb", type=float, default=1.5, help="weights per type, GB")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--against", help="another build's library of the (one) level in --levels")
    ap.add_argument("--reps", type=int, default=7, help="with --against")
    args = ap.parse_args()
    if args.against and "," in args.levels:
        ap.error("--against compares builds of one level: name one in --levels")
    torch.set_num_threads(args.threads)
    bw = read_bandwidth()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "unknown CPU")
    print(f"{cpu}, {args.threads} threads, load average {os.getloadavg()[0]:.2f}; "
          f"read bandwidth {bw:.1f} GB/s (1 row: GB/s, share of the probe before each "
          f"repetition, the probes' median)")
    buf = torch.ones(256 << 20, dtype=torch.float32)  # 1 GiB: the probe
    rows = [int(r) for r in args.rows.split(",")]
    print("| level | type | " + " | ".join(
        f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---" * (len(rows) + 2) + "|")
    for level in args.levels.split(","):
        os.environ[native.ISA_ENV] = level
        native.reset()
        if native.load() is None:
            print(f"| {level} | not available here |")
            continue
        other = other_build(args.against) if args.against else None
        for kind in args.types.split(","):
            layers = matrices(kind, args.gb)
            stored = sum(layer.out_features * k * (2 if kind in ("F16", "BF16") else
                                                    gguf.GGML_QUANT_SIZES[_T[kind]][1]
                                                    / gguf.GGML_QUANT_SIZES[_T[kind]][0])
                         for layer, _, k in layers)
            macs = sum(n * k for _, n, k in layers)
            cells = []
            for r in rows:
                work, unit = (stored, "GB/s") if r == 1 else (macs * r, "GMAC/s")
                if args.against:
                    probes, ours, theirs, same = time_pair(layers, r, args.reps, other,
                                                           buf if r == 1 else None)
                    shares = ""
                    if r == 1:
                        shares = (f"; shares {_share(work, probes, ours)} vs "
                                  f"{_share(work, probes, theirs)} of "
                                  f"{statistics.median(probes):.0f}")
                    cells.append(f"{work / min(ours) / 1e9:.0f} vs {work / min(theirs) / 1e9:.0f}"
                                 f" {unit} (medians {work / statistics.median(ours) / 1e9:.0f}"
                                 f" vs {work / statistics.median(theirs) / 1e9:.0f}{shares})"
                                 + ("" if same else " OUTPUTS DIFFER"))
                    continue
                if r == 1:
                    runs = time_rows(layers, r, 7, buf)
                    probes, times = [p for p, _ in runs], [t for _, t in runs]
                    cells.append(f"{stored / min(times) / 1e9:.1f} GB/s "
                                 f"({_share(stored, probes, times)} of "
                                 f"{statistics.median(probes):.0f})")
                    continue
                dt = statistics.median(t for _, t in time_rows(layers, r, 2))
                cells.append(f"{macs * r / dt / 1e9:.0f} GMAC/s")
            print(f"| {level} | {kind} | " + " | ".join(cells) + " |", flush=True)
            del layers


if __name__ == "__main__":
    main()
