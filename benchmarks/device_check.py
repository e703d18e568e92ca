"""The prepared accelerator check (issue 6): run it as one command on a lent GPU machine.

1. Greedy parity: the same prompts on CPU (float32, the reference) and on the device in
   float32 (tokens must be identical) and in bfloat16 (agreement reported: bf16 rounding may
   flip a near-tie, so a divergence point is printed, not asserted).
2. Batch invariance on the device: every prompt alone vs all together (identical tokens).
3. Throughput on the device: batch 1 / 16 / 64, 128-token prompts, 128 output tokens.

Prints one JSON object last (also written to ``$OUT/device_check.json`` when ``OUT`` is set).
Usage (device machine): ``python benchmarks/device_check.py --device cuda``; on a CPU-only
machine ``--device cpu`` runs the same steps as a smoke test (``--quick`` for fewer tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from radixserve import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Write a poem about the sea:\n", "def fibonacci(n):",
           "List three colors:", "Once upon a time, in a faraway land,", "1, 2, 3, 4,"]


def greedy(llm: LLM, prompts, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def throughput(llm: LLM, batch: int, length: int, vocab: int) -> float:
    rng = random.Random(batch)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(batch)]
    greedy(llm, prompts[:1], 4)  # warm-up
    start = time.perf_counter()
    outs = greedy(llm, prompts, length)
    return sum(map(len, outs)) / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer tokens and batches")
    args = ap.parse_args()
    tokens = 8 if args.quick else 32
    report: dict = {"device": args.device}

    cpu = LLM(args.model, quantization="none", show_progress=False)  # the float reference
    reference = [greedy(cpu, [p], tokens)[0] for p in PROMPTS]
    vocab = cpu.engine.vocab_size
    del cpu

    for dtype in ("float32", "bfloat16"):
        llm = LLM(args.model, device=args.device, dtype=dtype, quantization="none",
                  show_progress=False)
        alone = [greedy(llm, [p], tokens)[0] for p in PROMPTS]
        together = greedy(llm, PROMPTS, tokens)
        report[dtype] = {
            "matches_cpu": sum(a == r for a, r in zip(alone, reference)),
            "first_difference": [first_difference(a, r) for a, r in zip(alone, reference)],
            "batch_invariant": alone == together,
        }
        if dtype == "bfloat16" or args.device == "cpu":
            batches = (1, 4) if args.quick else (1, 16, 64)
            length = 16 if args.quick else 128
            report[dtype]["output_tok_s"] = {
                str(b): round(throughput(llm, b, length, vocab), 1) for b in batches}
        print(dtype, json.dumps(report[dtype]), flush=True)
        del llm

    report["ok"] = (report["float32"]["matches_cpu"] == len(PROMPTS)
                    and report["float32"]["batch_invariant"])
    text = json.dumps(report)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "device_check.json"), "w") as f:
            f.write(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
