"""What LoRA adapters cost: decode throughput of one batch on the embedded model
(SmolLM2-135M Q4_1) with no adapter ever loaded (the native one-call-per-layer stack; best of
``--runs``), then, interleaved run by run (best of each), with 4 adapters loaded but unused, every row on one adapter, and rows spread over 4 adapters. The
adapters are random, rank 16 on q/k/v/o/gate/up/down, written as PEFT folders here. Prefix
caching is off so every run computes the same work. Figures are indicative on a busy machine:
the load average is printed beside them.

Usage:
  python benchmarks/lora_cost.py [--batch 16] [--tokens 64] [--runs 3] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from safetensors.torch import save_file

from radixserve import LLM, SamplingParams

_TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
            "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: str, cfg, rank: int, seed: int) -> str:
    """A random PEFT LoRA folder for a model of shape ``cfg``."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"q_proj": (cfg.hidden_size, cfg.q_size), "k_proj": (cfg.hidden_size, cfg.kv_size),
              "v_proj": (cfg.hidden_size, cfg.kv_size), "o_proj": (cfg.q_size, cfg.hidden_size),
              "gate_proj": (cfg.hidden_size, cfg.intermediate_size),
              "up_proj": (cfg.hidden_size, cfg.intermediate_size),
              "down_proj": (cfg.intermediate_size, cfg.hidden_size)}
    tensors = {}
    for i in range(cfg.num_layers):
        for parent, names in _TARGETS.items():
            for name in names:
                n_in, n_out = shapes[name]
                stem = f"base_model.model.model.layers.{i}.{parent}.{name}"
                tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, n_in, generator=gen) * 0.02
                tensors[f"{stem}.lora_B.weight"] = torch.randn(n_out, rank, generator=gen) * 0.02
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": [n for names in _TARGETS.values() for n in names]}, f)
    return folder


def tokens_per_s(llm: LLM, prompts, params, lora) -> float:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora=lora)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    llm = LLM(show_progress=False, speculative="off", enable_prefix_caching=False)
    prompts = [[200 + 13 * i + t for t in range(32)] for i in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts, params)  # warm up
    plain = max(tokens_per_s(llm, prompts, params, None) for _ in range(args.runs))
    cfg = llm.engine.runner.model.config
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(4):
            llm.load_lora(f"a{k}", write_adapter(os.path.join(tmp, f"a{k}"), cfg, args.rank, k))
    # (the weights are in memory now; the folders may go)
    llm.generate(prompts, params, lora="a0")  # warm up the Python layers
    modes = {"4 loaded, none used": None, "all rows on 1 adapter": "a0",
             "rows over 4 adapters": [f"a{i % 4}" for i in range(args.batch)]}
    rows = {"no adapter ever loaded": plain, **dict.fromkeys(modes, 0.0)}
    for _ in range(args.runs):  # interleaved, best of each: the machine's load drifts
        for name, lora in modes.items():
            rows[name] = max(rows[name], tokens_per_s(llm, prompts, params, lora))
    load = os.getloadavg()
    print(f"embedded SmolLM2-135M Q4_1, batch {args.batch}, {args.tokens} tokens each, rank "
          f"{args.rank}, threads {torch.get_num_threads()}, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    base = rows["no adapter ever loaded"]
    for name, tps in rows.items():
        print(f"  {name:<24} {tps:8.1f} tok/s  ({tps / base:5.2f}x)")


if __name__ == "__main__":
    main()
