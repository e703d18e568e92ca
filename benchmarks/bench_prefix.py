"""Engine-core benchmarks through the offline API (issue 4): prints figures, asserts nothing.

1. shared prefix: 32 requests = one 1,000-token prefix + distinct 32-token suffixes, 32 output
   tokens, 8 in flight (max_num_seqs=8): wall time with the radix cache vs --no-prefix-cache.
2. multi-turn chat: 8 conversations x 4 turns, each turn resending the whole history:
   prefix-cache hit rate per turn.
3. long-prompt interference: 4 streams decoding while a 4,000-token prompt arrives: the
   streams' inter-token latency with chunked prefill (128/512-token budgets) and without.

Usage: .venv/bin/python benchmarks/bench_prefix.py [--only shared,multiturn,interference]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from radixserve import LLM, SamplingParams
from radixserve.messages import EngineCoreRequest

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def token_prompt(tok, rng, n: int) -> list[int]:
    ids = tok.encode(words(rng, n * 2), add_special_tokens=False)
    return ids[:n]


def shared_prefix(model: str | None) -> None:
    for cache in (True, False):
        llm = LLM(model, max_num_seqs=8, enable_prefix_caching=cache, show_progress=False)
        tok, rng = llm.get_tokenizer(), random.Random(0)
        llm.generate([token_prompt(tok, rng, 16)], SamplingParams(max_tokens=1))  # warm-up
        prefix = token_prompt(tok, rng, 1000)
        prompts = [prefix + token_prompt(tok, rng, 32) for _ in range(32)]
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t0
        cached = sum(o.num_cached_tokens for o in outs)
        print(f"shared prefix, prefix cache {'on ' if cache else 'off'}: {dt:6.1f} s "
              f"({cached} of {sum(len(p) for p in prompts)} prompt tokens from the cache)")


def multiturn(model: str | None) -> None:
    llm = LLM(model, show_progress=False)
    rng = random.Random(1)
    convs = [[{"role": "system", "content": "You are a helpful assistant."}] for _ in range(8)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for turn in range(4):
        for conv in convs:
            conv.append({"role": "user", "content": words(rng, 40) + "?"})
        outs = llm.chat(convs, params)
        prompt = sum(len(o.prompt_token_ids) for o in outs)
        cached = sum(o.num_cached_tokens for o in outs)
        print(f"multi-turn, turn {turn + 1}: prefix hit rate {cached / prompt:6.1%} "
              f"({cached}/{prompt} prompt tokens)")
        for conv, out in zip(convs, outs):
            conv.append({"role": "assistant", "content": out.outputs[0].text})


def interference(model: str | None) -> None:
    for budget in (128, 512, 8192):
        llm = LLM(model, max_num_batched_tokens=budget, show_progress=False)
        engine, tok, rng = llm.engine, llm.get_tokenizer(), random.Random(2)
        params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
        eos = sorted(tok.eos_token_ids)
        for i in range(4):
            engine.add_request(EngineCoreRequest(request_id=f"s{i}", sampling_params=params,
                                                 prompt_token_ids=token_prompt(tok, rng, 64),
                                                 eos_token_ids=eos))
        stamps: dict[str, list[float]] = {f"s{i}": [] for i in range(4)}
        steps = 0
        while engine.has_unfinished_requests():
            if steps == 20:
                engine.add_request(EngineCoreRequest(
                    request_id="long", prompt_token_ids=token_prompt(tok, rng, 4000),
                    sampling_params=SamplingParams(max_tokens=1), eos_token_ids=eos))
            for out in engine.step().outputs:
                if out.request_id in stamps:
                    stamps[out.request_id].append(time.perf_counter())
            steps += 1
        # stamps[19] is each stream's output of step 20, before the long prompt arrives
        gaps = [b - a for ts in stamps.values() for a, b in zip(ts[19:], ts[20:])]
        label = f"token budget {budget:5d}" + (" (no chunking)" if budget > 4096 else "")
        print(f"interference, {label}: ITL of the 4 streams after the long prompt arrives: "
              f"mean {statistics.mean(gaps) * 1000:6.1f} ms, max {max(gaps) * 1000:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--only", default="shared,multiturn,interference")
    args = ap.parse_args()
    for name in args.only.split(","):
        {"shared": shared_prefix, "multiturn": multiturn, "interference": interference}[name](
            args.model)


if __name__ == "__main__":
    main()
