"""KV cache element types (``--kv-cache-dtype``) on the embedded model: single-stream decode
after a long prompt (prefill subtracted; the dtypes alternate so drift hits all alike) and the
fidelity of each against a float32 pool (KL of the next-token distributions over every
position of a real text, top-1 agreement), at the CPU level this process loads
(``RADIXSERVE_CPU_ISA`` forces one).

    .venv/bin/python benchmarks/bench_kv_dtype.py [--prompt-lens 128,1024,4000] [--reps 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from radixserve import LLM, SamplingParams
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native

KINDS = ("float32", "float16", "bfloat16", "int8")
TEXT = ("A paged KV cache splits every sequence's keys and values into fixed-size blocks, so "
        "memory is handed out a block at a time and prefixes shared by many requests are "
        "stored once. The scheduler gives each step a budget of tokens; decodes take one "
        "each, prompts take what is left, in chunks. ") * 12


def _decode_tok_s(llm: LLM, ids: list[int], new: int = 64) -> float:
    def run(k: int) -> float:
        t0 = time.perf_counter()
        llm.generate({"prompt_token_ids": ids},
                     SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True))
        return time.perf_counter() - t0
    prefill = min(run(1) for _ in range(2))
    return new / (run(new + 1) - prefill)


def _logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    pool = llm.engine.scheduler.kv.block_pool
    blocks = pool.allocate(-(-len(ids) // llm.engine.runner.block_size))
    try:
        return llm.engine.runner.all_logits([ScheduledSeq("kl", ids, 0, blocks, sample=False)])[0]
    finally:
        pool.free(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt-lens", default="128,1024,4000")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    llms = {kv: LLM(kv_cache_dtype=kv, show_progress=False, enable_prefix_caching=False,
                    kv_cache_memory_gb=2.0) for kv in KINDS}
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}; kernels {native.describe().level}; threads {torch.get_num_threads()}")
    text_ids = llms["float32"].get_tokenizer().encode(TEXT)
    ref = torch.log_softmax(_logits(llms["float32"], text_ids), -1)
    for kv in KINDS[1:]:
        ours = torch.log_softmax(_logits(llms[kv], text_ids), -1)
        kl = (ref.exp() * (ref - ours)).sum(-1)
        agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
        print(f"{kv:9s} vs float32 KV over {len(text_ids)} positions: KL mean {kl.mean():.2e}, "
              f"max {kl.max():.2e}; top-1 agreement {agree:.4f}")
    for n in (int(x) for x in args.prompt_lens.split(",")):
        ids = [(i * 7919) % 40000 + 100 for i in range(n)]
        for rep in range(args.reps):
            figures = {kv: _decode_tok_s(llm, ids) for kv, llm in llms.items()}
            print(f"prompt {n:5d}, rep {rep}: " + ", ".join(
                f"{kv} {tok_s:6.1f}" for kv, tok_s in figures.items()) + " decode tok/s")


if __name__ == "__main__":
    main()
