"""``radixserve bench offline``: model load time, prefill speed and batched decode throughput.

Prompts are random token ids (distinct per request, fixed seed); generation is greedy with EOS
ignored so every request yields exactly its asked length. With ``--peer-transformers`` the same
GGUF is run through Hugging Face transformers ``generate()`` (fp32, static batch) in the same
sitting, so the figures sit side by side.
"""

from __future__ import annotations

import argparse
import json
import random
import time


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-sizes", default="1,16,64", help="comma-separated")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--peer-transformers", action="store_true",
                        help="also run HF transformers generate() on the same model")
    parser.add_argument("--json", default=None, help="write the figures to this file")


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def run(args: argparse.Namespace, engine_kwargs: dict) -> int:
    from radixserve import LLM, SamplingParams

    figures: dict = {}
    t0 = time.perf_counter()
    llm = LLM(args.model, show_progress=False, **engine_kwargs)
    figures["load_s"] = time.perf_counter() - t0
    print(f"model load: {figures['load_s']:.2f} s")
    vocab = llm.engine.vocab_size

    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.generate(_prompts(1, 32, vocab, 0), one)  # warm-up
    prompt = _prompts(1, args.prefill_len, vocab, 1)
    t0 = time.perf_counter()
    llm.generate(prompt, one)
    dt = time.perf_counter() - t0
    figures["prefill_tok_s"] = args.prefill_len / dt
    print(f"prefill {args.prefill_len} tokens: {dt * 1000:.0f} ms = "
          f"{figures['prefill_tok_s']:.0f} tok/s")

    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    for b in (int(x) for x in args.batch_sizes.split(",")):
        prompts = _prompts(b, args.input_len, vocab, 100 + b)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t0
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        figures[f"batch{b}_out_tok_s"] = n_out / dt
        print(f"batch {b:3d}: {n_out} output tokens in {dt:.2f} s = {n_out / dt:.1f} output tok/s "
              f"(prompt {args.input_len}, output {args.output_len}, incl. prefill)")
    if args.peer_transformers:
        figures.update(_transformers_peer(llm.source, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


def _transformers_peer(source, args) -> dict:
    """HF transformers generate(), fp32, static batch, on the same weights."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    if source.kind == "gguf":
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(source.path), gguf_file=os.path.basename(source.path),
            torch_dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(source.path, torch_dtype=torch.float32)
    print(f"[transformers] model load: {time.perf_counter() - t0:.2f} s")
    figures = {}
    vocab = model.config.vocab_size
    for b in (int(x) for x in args.batch_sizes.split(",")):
        ids = torch.tensor(_prompts(b, args.input_len, vocab, 100 + b))
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.output_len, min_new_tokens=args.output_len)
        dt = time.perf_counter() - t0
        n_out = (out.shape[1] - args.input_len) * b
        figures[f"transformers_batch{b}_out_tok_s"] = n_out / dt
        print(f"[transformers] batch {b:3d}: {n_out / dt:.1f} output tok/s")
    return figures
