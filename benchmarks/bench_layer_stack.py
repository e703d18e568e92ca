"""The native layer stack (one decoder_layer.cpp call per layer) against the Python layers, in
one process on one engine, alternating: the layer stack's time per decode step (minimum and
median over every step of every round: the minimum is what a shared machine's interference
leaves least touched) and each round's whole-generate tok/s (best round), and whether the
greedy tokens agree.

Usage (the level from ``RADIXSERVE_CPU_ISA`` as everywhere; radixserve imported from the tree
under test, e.g. ``PYTHONPATH=.`` in a worktree):
  python benchmarks/bench_layer_stack.py MODEL [--threads 1] [--rounds 3] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack


class Timed:
    """A layer stack that records how long each call of ``rows`` rows took."""

    def __init__(self, stack, rows: int) -> None:
        self.stack, self.rows, self.times = stack, rows, []

    def __call__(self, positions, x):
        t0 = time.perf_counter()
        out = self.stack(positions, x)
        if x.shape[0] == self.rows:
            self.times.append(time.perf_counter() - t0)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--output-len", type=int, default=48)
    args = parser.parse_args()
    llm = LLM(args.model, show_progress=False, threads=args.threads)
    model, vocab = llm.engine.runner.model, llm.engine.vocab_size
    prompts = [[(13 * i + 7 * b + 1) % vocab for i in range(16)] for b in range(args.batch)]
    llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    if not isinstance(model._stack, NativeLayerStack):
        raise SystemExit(f"{args.model} does not run the native layer stack here")
    stacks = {"native": Timed(model._stack, args.batch),
              "python": Timed(PythonLayerStack(model.layers), args.batch)}
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    best, tokens = dict.fromkeys(stacks, 0.0), {}
    for _ in range(args.rounds):
        for name, stack in stacks.items():
            model._stack = stack
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            best[name] = max(best[name], n / (time.perf_counter() - t0))
            tokens[name] = [o.outputs[0].token_ids for o in outs]
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"level {native.describe().level}, threads {args.threads}, batch {args.batch}, "
          f"{args.rounds} rounds, load {load}")
    for name, s in stacks.items():
        print(f"  {name}: layer stack per decode step min {min(s.times) * 1e3:.2f} ms, median "
              f"{statistics.median(s.times) * 1e3:.2f} ms; generate {best[name]:.1f} tok/s")
    print(f"  greedy tokens equal: {tokens['native'] == tokens['python']}")


if __name__ == "__main__":
    main()
