"""Prefix-cache hits per turn of a reasoning model's chat, with and without the next-turn warm-up.

A 6-turn conversation on a tiny random model (tests/tiny_models.py) whose tokenizer carries a
real reasoning template (llama.cpp's copies in tests/chat_templates/). Each answer is forced by
a regex to reasoning then a long answer (the output the radix cache then holds), in the tokens
the tokenizer encodes that text to (`canonical_bias`), as a trained model writes it; the client
sends each answer back with its ``reasoning_content``, as clients do, and the template decides
what the next prompt keeps. Per turn: prompt tokens, cached tokens
(``usage.prompt_tokens_details.cached_tokens``) and the tokens prefilled again. Scenarios:

- chat (Qwen3, DeepSeek-R1 distill, QwQ): a new user message each turn; the templates drop
  the earlier reasoning, so without the warm-up each turn re-prefills the previous answer.
- tool loop (Qwen3): each turn calls a tool and gets a long result; Qwen3's template keeps the
  reasoning after the last user query, so the cache hits without any warm-up.

Each scenario runs on a server started with ``--no-warm-next-turn`` and on one with the
warm-up (the default); between turns the benchmark waits until the engine is idle (a client
reading an answer or running a tool takes longer than the warm-up on this model).

    python benchmarks/reasoning_turns.py [--turns 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "server"))
from server_proc import ServerProc
from tiny_models import make_hf_model

from radixserve.tokenizer.tokenizer import Tokenizer

TEMPLATES = ROOT / "tests" / "chat_templates"
CHAT_TEMPLATES = {"qwen3": "Qwen-Qwen3-0.6B.jinja",
                  "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                  "qwq": "Qwen-QwQ-32B.jinja"}
# no trailing space: parsers and templates strip it, so a model ends its text before the tag
REASONING = ("I think we should look at the time and find a way to help them with this. " * 4
             ).strip()
ANSWER = ("The good way is to keep the time and help the people in the world today. " * 8).strip()
RESULT = "the file holds a long list of names and numbers for the people in the world. " * 10
TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}}}}}]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def model_dir(template: str, root: Path) -> Path:
    path = make_hf_model("qwen2", root / template / "m", seed=3, max_position_embeddings=8192)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (TEMPLATES / CHAT_TEMPLATES[template]).read_text()
    config_path.write_text(json.dumps(config))
    return path


def wait_idle(url: str, timeout: float = 60.0) -> None:
    """Until the engine runs nothing and nothing waits (a warm-up included)."""
    time.sleep(0.2)  # a warm-up renders its prefix before it is submitted
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        busy = sum(float(v) for v in re.findall(
            r"^radixserve:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", text, re.MULTILINE))
        if busy == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("the engine stayed busy")


def canonical_bias(tokenizer, text: str) -> dict[str, float]:
    """A logit bias that makes the greedy random model spell ``text`` (forced by a regex) in
    the tokens the tokenizer encodes it to, longest first, as a trained model mostly does:
    otherwise it picks any valid spelling, and the next prompt's ids (the text encoded
    again) part from the cached output at its first token, whatever the template keeps."""
    ids = set(tokenizer.encode_prompt(text))
    return {str(i): 60.0 + 4 * min(len(tokenizer.backend.id_to_token(i)), 10) for i in ids}


def turn(url: str, messages: list[dict], output: str, tools: bool,
         bias: dict[str, float]) -> tuple[dict, dict, float]:
    """One request whose output is forced to ``output``: (usage, message, seconds)."""
    body = {"model": "m", "messages": messages, "max_tokens": 1024, "temperature": 0,
            # logprobs: every token sampled under the bias (the grammar's jump-forward
            # would append the forced text in its own spelling)
            "logit_bias": bias, "logprobs": True,
            "structured_outputs": {"regex": re.escape(output), "after_reasoning": False}}
    if tools:
        body["tools"] = TOOLS
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    elapsed = time.perf_counter() - start
    if r.status_code != 200:
        raise RuntimeError(f"turn refused: {r.status_code} {r.text}")
    answer = r.json()
    return answer["usage"], answer["choices"][0]["message"], elapsed


def conversation(url: str, tokenizer, scenario: str, turns: int) -> list[dict]:
    """Run one conversation; a row per turn."""
    messages = [{"role": "system", "content": "You help people. " * 20},
                {"role": "user", "content": "How do I help the people? (turn 1)"}]
    tools = scenario == "tool loop"
    rows = []
    for i in range(1, turns + 1):
        if tools:
            call = f'{{"name": "read", "arguments": {{"path": "notes{i}.txt"}}}}'
            output = f"<think>\n{REASONING}\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
        else:
            output = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
        usage, message, elapsed = turn(url, messages, output, tools,
                                       canonical_bias(tokenizer, output))
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows.append({"turn": i, "prompt": usage["prompt_tokens"], "cached": cached,
                     "prefilled": usage["prompt_tokens"] - cached, "seconds": elapsed})
        # "" for a call's null content: Qwen3's template fails on null
        sent = {"role": "assistant", "content": message.get("content") or "",
                "reasoning_content": message.get("reasoning_content")}
        if message.get("tool_calls"):
            sent["tool_calls"] = message["tool_calls"]
            messages += [sent, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                "content": RESULT}]
        else:
            messages += [sent, {"role": "user", "content": f"And then? (turn {i + 1})"}]
        wait_idle(url)
    return rows


def warmup_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^radixserve:next_turn_warmup_tokens(?:_total)?\{[^}]*\} (\S+)$", text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--json", help="write the rows here")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser.add_argument("--only", choices=["chat", "tool loop"], help="one scenario")
    args = parser.parse_args()
    plan = [(t, "chat") for t in CHAT_TEMPLATES] + [("qwen3", "tool loop")]
    plan = [p for p in plan if args.only in (None, p[1])]
    results = []
    print(f"CPU: {cpu_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        for template, scenario in plan:
            path = model_dir(template, Path(tmp))
            for warm in (False, True):
                extra = [] if warm else ["--no-warm-next-turn"]
                # no disk tier: each server starts cold, and the radix cache alone is measured
                server = ServerProc("--model", str(path), "--num-kv-blocks", "1024",
                                    "--no-kv-disk-cache", "--reasoning-parser", "qwen3",
                                    "--tool-call-parser", "hermes", *extra, timeout=180)
                try:
                    rows = conversation(server.url, Tokenizer.from_hf_dir(path), scenario,
                                        args.turns)
                    prefilled_by_warmups = warmup_tokens(server.url)
                finally:
                    server.stop()
                results.append({"template": template, "scenario": scenario, "warm": warm,
                                "rows": rows, "warmup_tokens": prefilled_by_warmups})
                report(results[-1])
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "results": results},
                                              indent=1))


def report(result: dict) -> None:
    rows = result["rows"]
    mode = "warm-up on" if result["warm"] else "warm-up off"
    print(f"\n{result['template']} / {result['scenario']} / {mode}")
    print("turn  prompt  cached  re-prefilled")
    for r in rows:
        print(f"{r['turn']:>4}  {r['prompt']:>6}  {r['cached']:>6}  {r['prefilled']:>12}")
    prompt = sum(r["prompt"] for r in rows)
    cached = sum(r["cached"] for r in rows)
    later = rows[1:]  # turn 1 is cold either way
    print(f"turns 2+: re-prefilled {sum(r['prefilled'] for r in later)} tokens, hit rate "
          f"{sum(r['cached'] for r in later) / max(1, sum(r['prompt'] for r in later)):.1%}; "
          f"all turns {cached}/{prompt}; prefilled by warm-ups in the background: "
          f"{result['warmup_tokens']:.0f}")


if __name__ == "__main__":
    main()
