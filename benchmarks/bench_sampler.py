"""Sampler micro-benchmark: ms per call for B in (1, 16, 64), V = 49152.

Run: .venv/bin/python benchmarks/bench_sampler.py [--threads N] [--iters N]
``build`` (SamplingBatch.build, host side) is timed separately from the sampler call. The
penalty case has 1024 prompt + 256 output tokens per row. Logits are randn * 3: at T = 0.8 the
top-512 mass is ~0.87-0.96, so top-p-only rows at p = 0.9 often need the full sort (a
pessimistic case: real next-token distributions are peakier).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixserve.runner.sampler import Sampler, SamplingBatch
from radixserve.sampling_params import SamplingParams

V = 49152
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "temp+top_p": SamplingParams(temperature=0.8, top_p=0.9),
    "temp+top_p+top_k": SamplingParams(temperature=0.8, top_p=0.9, top_k=50),
    "+penalties": SamplingParams(temperature=0.8, top_p=0.9, top_k=50, repetition_penalty=1.1,
                                 presence_penalty=0.5, frequency_penalty=0.3),
}


def timed(fn, iters: int) -> float:
    """Median wall ms of ``iters`` calls after two warm-ups."""
    fn(), fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, V={V}")
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler()
    print(f"{'case':<18}{'B':>4}{'sample ms':>11}{'build ms':>10}")
    for name, params in CASES.items():
        for B in (1, 16, 64):
            logits = torch.randn(B, V, generator=gen) * 3
            prompts = torch.randint(0, V, (B, 1024), generator=gen).tolist()
            outputs = torch.randint(0, V, (B, 256), generator=gen).tolist()

            def build():
                return SamplingBatch.build([params] * B, list(range(B)), outputs, prompts,
                                           [{0}] * B, V, torch.device("cpu"))

            batch = build()
            sample_ms = timed(lambda: sampler(logits, batch), args.iters)
            build_ms = timed(build, args.iters)
            print(f"{name:<18}{B:>4}{sample_ms:>11.2f}{build_ms:>10.2f}")


if __name__ == "__main__":
    main()
