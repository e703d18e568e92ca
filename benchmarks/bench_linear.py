"""Quantized linear layers per decode step at every CPU level this machine runs (the native
int8 kernel, ``--quantization int8``, and the GGUF block kernel, ``gguf``, on the file types
people download, F16 and BF16 included: the 16-bit parts), beside the plain float path
(torch's fp32 ``nn.Linear``, what runs without the kernels) and torch's bf16 ``nn.Linear`` on the
same shapes.

One "step" runs the embedded model's 121 linear shapes (30 layers of qkv, o, gate/up, down, and
the head) once, with distinct random weights so they come from memory as in a real step; each
block column holds all 121 matrices in that type (Q4_K_M: Q4_K with Q6_K for down and the head,
as llama.cpp mixes them). K-quants need 256-multiples, so the K columns use the embedded
model's shapes rounded up (576 -> 768, 1536 -> 1536); F16 / BF16 take the shapes as they are.
Prints ms per step for each level and row count (at the amx level the int8 kernel uses AMX tiles from 8 rows, Q4_0/Q4_1 from 32).

    .venv/bin/python benchmarks/bench_linear.py [--rows 1,16,64,512] [--levels avx2,generic]
        [--types Q4_1,Q8_0,Q4_K_M,F16,BF16] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import gguf
import torch

from radixserve.kernels import native
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.block_linear import BlockLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kquants import quantize  # noqa: E402  (the tests' K-quant quantizer)

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def _layers() -> list[Int8Linear]:
    gen = torch.Generator().manual_seed(0)
    return [Int8Linear.from_float(torch.randn(n, k, generator=gen) * 0.05) for n, k in SHAPES]


def _float_layers(dtype: torch.dtype = torch.float32) -> list[torch.nn.Linear]:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for n, k in SHAPES:
        lin = torch.nn.Linear(k, n, bias=False, dtype=dtype)
        lin.weight.data = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
        layers.append(lin)
    return layers


def _round256(k: int) -> int:
    return -(-k // 256) * 256


def _block_layers(kind: str) -> list[torch.nn.Module]:
    """The step's matrices as ``kind`` blocks (a type name, or Q4_K_M for the mix)."""
    gen = torch.Generator().manual_seed(0)
    T = gguf.GGMLQuantizationType
    layers: list[torch.nn.Module] = []
    for i, (n, k) in enumerate(SHAPES):
        if kind == "Q4_K_M":
            qtype = T.Q6_K if i % 4 == 3 or i == len(SHAPES) - 1 else T.Q4_K
        else:
            qtype = T[kind]
        if qtype in (T.F16, T.BF16):
            w = (torch.randn(n, k, generator=gen) * 0.05).to(
                torch.float16 if qtype == T.F16 else torch.bfloat16)
            layers.append(BlockLinear.from_stored([(qtype, w.view(torch.uint8))], k))
            continue
        if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
            k = _round256(k)
        raw = quantize((torch.randn(n, k, generator=gen) * 0.05).numpy(), qtype)
        layers.append(BlockLinear.from_stored([(qtype, torch.from_numpy(raw).reshape(n, -1))], k))
    return layers


def _steps_ms(columns: list[tuple[list[torch.nn.Module], torch.dtype]], rows: int,
              reps: int) -> list[float]:
    """Best ms per step of each column's layers, the columns run round-robin (one step each
    per repetition) so that noise from other processes falls on all of them alike."""
    inputs = [[torch.randn(rows, lin.in_features, dtype=dtype) for lin in layers]
              for layers, dtype in columns]
    best = [float("inf")] * len(columns)
    for _ in range(reps + 1):  # the first pass warms up
        for c, (layers, _) in enumerate(columns):
            t0 = time.perf_counter()
            for lin, x in zip(layers, inputs[c]):
                lin(x)
            best[c] = min(best[c], time.perf_counter() - t0)
    return [b * 1000 for b in best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,16,64,512")
    parser.add_argument("--levels", default=None, help="default: every level this CPU runs")
    parser.add_argument("--types", default="Q4_0,Q4_1,Q5_K,Q6_K,Q8_0,Q4_K_M")
    parser.add_argument("--threads", type=int, default=None, help="default: torch's")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    info = native.describe()
    levels = args.levels.split(",") if args.levels else [
        lv for lv in info.runnable if lv in info.built]
    rows_list = [int(r) for r in args.rows.split(",")]
    kinds = args.types.split(",")
    print(f"CPU: {_cpu_model()}; threads {torch.get_num_threads()}")
    print("ms per step of 121 linears (K-quant columns on 768/1536-wide inputs)")
    with torch.inference_mode():
        torch_columns = [(_float_layers(), torch.float32),
                         (_float_layers(torch.bfloat16), torch.bfloat16)]
        print(f"{'level':8s} {'rows':>4s} {'int8':>8s} " + " ".join(f"{k:>8s}" for k in kinds)
              + f" {'fp32 torch':>10s} {'bf16 torch':>10s}")
        for level in levels:
            os.environ[native.ISA_ENV] = level
            native.reset()
            columns = [(layers, torch.float32)
                       for layers in [_layers()] + [_block_layers(k) for k in kinds]]
            for rows in rows_list:
                ms = _steps_ms(columns + torch_columns, rows, 5 if rows < 128 else 2)
                print(f"{level:8s} {rows:4d} " + " ".join(f"{v:8.2f}" for v in ms[:-2])
                      + f" {ms[-2]:10.2f} {ms[-1]:10.2f}", flush=True)


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f
                     if line.startswith("model name")), "unknown CPU")


if __name__ == "__main__":
    main()
