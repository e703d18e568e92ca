"""Quantized linear layers per decode step at every CPU level this machine runs (the int8 and
4-bit native kernels, ``--quantization int8`` / ``q4``), beside the plain float path (torch's
fp32 ``nn.Linear``, what runs without the kernels) on the same shapes.

One "step" runs the embedded model's 121 linear shapes (30 layers of qkv, o, gate/up, down, and
the head) once, with distinct random weights so they come from memory as in a real step; in the
q4 column the 120 layer matrices are Q4_1 blocks and the head stays int8, as on the embedded
model. Prints ms per step for each level and row count (at the amx level the int8 kernel uses
AMX tiles from 8 rows, the 4-bit one from 32).

    .venv/bin/python benchmarks/bench_int8_linear.py [--rows 1,16,64,512] [--levels avx2,generic]
"""

from __future__ import annotations

import argparse
import os
import time

import gguf
import torch

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.q4_linear import Q4Linear
from radixserve.models.gguf_quant import q4_blocks

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def _layers() -> list[Int8Linear]:
    gen = torch.Generator().manual_seed(0)
    return [Int8Linear.from_float(torch.randn(n, k, generator=gen) * 0.05) for n, k in SHAPES]


def _float_layers() -> list[torch.nn.Linear]:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for n, k in SHAPES:
        lin = torch.nn.Linear(k, n, bias=False)
        lin.weight.data = torch.randn(n, k, generator=gen) * 0.05
        layers.append(lin)
    return layers


def _q4_layers() -> list[torch.nn.Module]:
    gen = torch.Generator().manual_seed(0)
    q4 = gguf.GGMLQuantizationType.Q4_1
    layers: list[torch.nn.Module] = []
    for n, k in SHAPES[:-1]:
        raw = gguf.quants.quantize((torch.randn(n, k, generator=gen) * 0.05).numpy(), q4)
        layers.append(Q4Linear.from_blocks(*q4_blocks(raw, q4, (n, k))))
    n, k = SHAPES[-1]
    return [*layers, Int8Linear.from_float(torch.randn(n, k, generator=gen) * 0.05)]


def _step_ms(layers: list[torch.nn.Module], rows: int, reps: int) -> float:
    inputs = [torch.randn(rows, lin.in_features) for lin in layers]
    best = float("inf")
    for _ in range(reps + 1):  # the first pass warms up
        t0 = time.perf_counter()
        for lin, x in zip(layers, inputs):
            lin(x)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,16,64,512")
    parser.add_argument("--levels", default=None, help="default: every level this CPU runs")
    args = parser.parse_args()
    info = native.describe()
    levels = args.levels.split(",") if args.levels else [
        lv for lv in info.runnable if lv in info.built]
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"CPU: {_cpu_model()}; threads {torch.get_num_threads()}")
    with torch.inference_mode():
        fp32 = _float_layers()
        float_ms = {rows: _step_ms(fp32, rows, 5 if rows < 128 else 2) for rows in rows_list}
        del fp32
        print("level    rows  int8 native  q4 native  fp32 torch   (ms per step of 121 linears)")
        for level in levels:
            os.environ[native.ISA_ENV] = level
            native.reset()
            int8, q4 = _layers(), _q4_layers()
            for rows in rows_list:
                reps = 5 if rows < 128 else 2
                a, c = _step_ms(int8, rows, reps), _step_ms(q4, rows, reps)
                print(f"{level:8s} {rows:4d}  {a:11.2f}  {c:9.2f}  {float_ms[rows]:10.2f}")


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f
                     if line.startswith("model name")), "unknown CPU")


if __name__ == "__main__":
    main()
