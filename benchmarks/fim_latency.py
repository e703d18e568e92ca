"""Fill-in-the-middle latency as an editor sees it, against a running server.

An editor asks for a completion at the cursor as the user types: one request at a time, a
short prefix and suffix around the cursor (the cursor a few characters further each time, the
prefix starting at a line, so most of the prompt is the previous one's), a few dozen tokens wanted, and many answers thrown
away as soon as they start because the user kept typing. This script replays that on a source
file: ``--requests`` requests, each streamed; a ``--cancel`` share of them closed right after
their first token (which aborts them in the server); the rest read to the end. It prints the
p50 / p90 time to the first token (every request) and to the last (the ones read to the end).

    radixserve serve --model coder.gguf --port 8123
    python benchmarks/fim_latency.py --url http://127.0.0.1:8123 --api infill
    python benchmarks/fim_latency.py --url http://127.0.0.1:8123 --api completions

``--api infill``: llama.cpp's ``POST /infill`` (input_prefix / input_suffix, llama.vscode's
fields); ``completions``: ``POST /v1/completions`` with ``suffix``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import httpx

_DEFAULT_SOURCE = Path(__file__).resolve().parents[1] / "radixserve" / "core" / "scheduler.py"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8123")
    p.add_argument("--api", choices=("infill", "completions"), default="infill")
    p.add_argument("--source", type=Path, default=_DEFAULT_SOURCE, help="the file 'edited'")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--n-predict", type=int, default=32)
    p.add_argument("--prefix-chars", type=int, default=600)
    p.add_argument("--suffix-chars", type=int, default=200)
    p.add_argument("--step-chars", type=int, default=6, help="cursor advance per request")
    p.add_argument("--cancel", type=float, default=0.5, help="share closed at first token")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def _request(args, prefix: str, suffix: str) -> tuple[str, dict]:
    if args.api == "infill":
        return "/infill", {"input_prefix": prefix, "input_suffix": suffix, "prompt": "",
                           "n_predict": args.n_predict, "stream": True, "top_k": 40,
                           "top_p": 0.99, "samplers": ["top_k", "top_p", "infill"],
                           "cache_prompt": True}
    return "/v1/completions", {"prompt": prefix, "suffix": suffix, "stream": True,
                               "max_tokens": args.n_predict, "temperature": 0.1}


def _text(api: str, event: dict) -> str:
    return event.get("content", "") if api == "infill" else event["choices"][0]["text"]


def one(client: httpx.Client, args, prefix: str, suffix: str, cancel: bool) -> tuple:
    """(seconds to the first token, seconds to the end or None when cancelled, pieces)."""
    path, body = _request(args, prefix, suffix)
    start = time.perf_counter()
    first, pieces = None, 0
    with client.stream("POST", args.url + path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if _text(args.api, event):
                pieces += 1
                if first is None:
                    first = time.perf_counter() - start
                    if cancel:
                        return first, None, pieces  # closing the stream aborts the request
    done = time.perf_counter() - start
    return first if first is not None else done, done, pieces


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def main() -> None:
    args = _args()
    rng = random.Random(args.seed)
    code = args.source.read_text(encoding="utf-8")
    cursor = min(len(code) // 3, args.prefix_chars + 1)
    firsts, dones = [], []
    with httpx.Client(timeout=300) as client:
        one(client, args, code[:cursor], code[cursor:cursor + args.suffix_chars], False)
        for _ in range(args.requests):
            cursor += args.step_chars
            # from the start of a line, as editors cut the prefix: it moves only when the
            # cursor crosses into a new line, so the previous prompt's start stays cached
            start = code.rfind("\n", 0, max(0, cursor - args.prefix_chars)) + 1
            prefix = code[start:cursor]
            suffix = code[cursor:cursor + args.suffix_chars]
            first, done, _ = one(client, args, prefix, suffix, rng.random() < args.cancel)
            firsts.append(first)
            if done is not None:
                dones.append(done)
    print(f"{args.api}: {args.requests} requests, n_predict {args.n_predict}, "
          f"{len(dones)} read to the end")
    print(f"  first token  p50 {_pct(firsts, 0.5):7.0f} ms   p90 {_pct(firsts, 0.9):7.0f} ms")
    if dones:
        print(f"  done         p50 {_pct(dones, 0.5):7.0f} ms   p90 {_pct(dones, 0.9):7.0f} ms"
              f"   (mean {statistics.mean(dones) * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
