"""Quantized linear layers per decode step: the native int8 kernel against oneDNN plus the eager
ops, and the native 4-bit kernel (``--quantization q4``) on the same shapes.

One "step" runs the embedded model's 121 linear shapes (30 layers of qkv, o, gate/up, down, and
the head) once, with distinct random weights so they come from memory as in a real step; in the
q4 column the 120 layer matrices are Q4_1 blocks and the head stays int8, as on the embedded
model. Prints ms per step for each row count (the int8 kernel uses AVX-512 VNNI below 8 rows,
AMX tiles from 8 up; the 4-bit one VNNI below 32, AMX from 32; ``RADIXSERVE_AMX=0`` keeps both
on VNNI).

    .venv/bin/python benchmarks/bench_int8_linear.py [--rows 1,16,64,128,512]
"""

from __future__ import annotations

import argparse
import time

import gguf
import torch

from radixserve.layers import int8_linear
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.q4_linear import Q4Linear
from radixserve.models.gguf_quant import q4_blocks

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def _layers(use_native: bool) -> list[Int8Linear]:
    gen = torch.Generator().manual_seed(0)
    saved = int8_linear._NativeWeight.build
    if not use_native:
        int8_linear._NativeWeight.build = classmethod(lambda cls, *args: None)
    try:
        return [Int8Linear.from_float(torch.randn(n, k, generator=gen) * 0.05)
                for n, k in SHAPES]
    finally:
        int8_linear._NativeWeight.build = saved


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
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,128,512")
    args = parser.parse_args()
    native, torch_path = _layers(True), _layers(False)
    if native[0]._native is None:
        raise SystemExit("native kernels unavailable here (see the log of radixserve.kernels)")
    q4 = _q4_layers()
    print("rows  int8 native  int8 torch (quantize + oneDNN + epilogue)  q4 native   (ms/step)")
    for rows in (int(r) for r in args.rows.split(",")):
        reps = 5 if rows < 128 else 2
        a, b, c = (_step_ms(layers, rows, reps) for layers in (native, torch_path, q4))
        print(f"{rows:4d}  {a:11.2f}  {b:40.2f}  {c:9.2f}")


if __name__ == "__main__":
    main()
