"""Fidelity of the default mode beside llama.cpp's, on the same file and the same tokens.

For each prompt, llama-server greedily continues it (``/completion`` with ``n_probs``: its top
log-probabilities at every generated position). Along that token path, the float model
(``--quantization none``: the file's weights dequantized to float32) and radixserve's default
(``auto``: the blocks as stored) give their full distributions. Printed per mode:

* agreement: how often its argmax is the float model's argmax, over the path's positions (and
  for radixserve how often it is llama-server's token: teacher-forced top-1 agreement);
* KL(float || mode) over llama-server's top-n tokens (both renormalized there), the one
  measure llama-server's output allows, for radixserve and for llama-server alike; and for
  radixserve also over the whole vocabulary.

    (llama-server -m FILE --port 8101 &)
    .venv/bin/python benchmarks/fidelity.py --llama-url http://127.0.0.1:8101 [--model FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from test_int8_embedded import _logits  # noqa: E402  (all-position logits through the runner)

from radixserve import LLM  # noqa: E402

PROMPTS = [
    "The paged KV cache splits every sequence's keys and values into fixed-size blocks, so",
    "def reverse(items):\n    \"\"\"Return the items in reverse order.\"\"\"\n",
    "Once upon a time, in a faraway land beyond the mountains, there lived an old king who",
    "Photosynthesis is the process by which plants",
    "The three most important things to remember when learning a new language are",
]


def llama_path(url: str, ids: list[int], n: int, top: int) -> tuple[list[int], list[dict]]:
    """llama-server's greedy tokens after ``ids`` and its top log-probs at each."""
    body = json.dumps({"prompt": ids, "n_predict": n, "temperature": 0, "n_probs": top,
                       "cache_prompt": False, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        data = json.load(r)
    probs = data["completion_probabilities"]
    tokens = [p["id"] for p in probs]
    tops = [{t["id"]: t["logprob"] for t in p["top_logprobs"]} for p in probs]
    return tokens, tops


def restricted_kl(ref: torch.Tensor, other_logprobs: dict[int, float] | torch.Tensor,
                  ids: list[int]) -> float:
    """KL(ref || other) over ``ids``, both renormalized there."""
    p = torch.log_softmax(ref, -1)[ids]
    q = (torch.tensor([other_logprobs[i] for i in ids]) if isinstance(other_logprobs, dict)
         else torch.log_softmax(other_logprobs, -1)[ids])
    p, q = p - torch.logsumexp(p, 0), q - torch.logsumexp(q, 0)
    return float((p.exp() * (p - q)).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-url", required=True)
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    ours = LLM(model=args.model, show_progress=False)
    ref = LLM(model=args.model, quantization="none", show_progress=False)
    tok = ours.get_tokenizer()
    rows = {"radixserve": [], "llama-server": []}
    kl_full, with_llama = [], []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        path, tops = llama_path(args.llama_url, ids, args.tokens, args.top)
        seq = ids + path
        start = len(ids) - 1  # logits at this position predict the first generated token
        lf, lo = _logits(ref, seq)[start:start + len(path)], _logits(ours, seq)[start:start + len(path)]
        for t in range(len(path)):
            support = list(tops[t])
            best = int(lf[t].argmax())
            with_llama.append(int(lo[t].argmax()) == path[t])
            rows["radixserve"].append((int(lo[t].argmax()) == best,
                                       restricted_kl(lf[t], lo[t], support)))
            rows["llama-server"].append((path[t] == best,
                                         restricted_kl(lf[t], tops[t], support)))
            p, q = torch.log_softmax(lf[t], -1), torch.log_softmax(lo[t], -1)
            kl_full.append(float((p.exp() * (p - q)).sum()))
    n = len(kl_full)
    print(f"{len(PROMPTS)} prompts, {n} positions along llama-server's greedy path; "
          f"KL(float || mode) over llama-server's top {args.top}")
    for name, values in rows.items():
        agree = sum(a for a, _ in values) / n
        kl = sum(k for _, k in values) / n
        print(f"  {name:12s} argmax = float's {agree:.3f}   KL (top {args.top}) mean {kl:.5f}")
    print(f"  radixserve   KL over the whole vocabulary mean {sum(kl_full) / n:.5f}")
    print(f"  radixserve   argmax = llama-server's token {sum(with_llama) / n:.3f}")


if __name__ == "__main__":
    main()
