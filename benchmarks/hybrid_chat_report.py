"""benchmarks/hybrid_chat.py's tables: saved runs (its ``--out`` files: a list of runs, each
with ``label``, ``spec``, ``turns`` and ``single`` figures) side by side, as markdown."""

from __future__ import annotations

import math
import statistics


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def later_ttft(run: dict) -> float:
    """Mean TTFT of turns 2 and on (those that can resume from the previous turn); NaN when
    none of them streamed text."""
    times = [t["ttft_s"] for t in run["turns"][1:] if t["ttft_s"] is not None]
    return statistics.mean(times) if times else math.nan


_MISSING = {"ttft_s": None, "decode_tok_s": None, "cached_tokens": None, "prompt_tokens": None}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def chat_table(runs: list[dict]) -> list[str]:
    """The chat turn by turn, every run side by side (TTFT, decode tok/s, cached / prompt
    tokens, TTFT over the first run's), then the turns 2+ mean TTFT and its ratios."""
    first, n = runs[0], max(len(r["turns"]) for r in runs)
    head = ["turn"] + [f"{r['label']} {c}" for r in runs
                       for c in ("TTFT s", "decode tok/s", "cached/prompt")]
    head += [f"TTFT {r['label']}/{first['label']}" for r in runs[1:]]
    lines = [_row(head), "|---" * len(head) + "|"]
    for i in range(n):
        turns = [r["turns"][i] if i < len(r["turns"]) else _MISSING for r in runs]
        cells = [str(i + 1)]
        for t in turns:
            cached = "-" if t["cached_tokens"] is None else t["cached_tokens"]
            cells += [_num(t["ttft_s"]), _num(t["decode_tok_s"]),
                      f"{cached}/{t['prompt_tokens'] or '-'}"]
        cells += [_ratio(t["ttft_s"], turns[0]["ttft_s"]) for t in turns[1:]]
        lines.append(_row(cells))
    if n > 1:
        means = ", ".join(f"{r['label']} {later_ttft(r):.2f} s" for r in runs)
        ratios = "; ".join(f"{r['label']}/{first['label']} {later_ttft(r) / later_ttft(first):.2f}x"
                           for r in runs[1:])
        lines.append(f"\nturns 2-{n} mean TTFT: {means}" + (f"; ratio {ratios}" if ratios else ""))
    wrong = [f"{r['label']} turn {i + 1}: {t['output_tokens']}" for r in runs
             for i, t in enumerate(r["turns"]) if t["output_tokens"] != r["spec"]["max_tokens"]]
    if wrong:
        lines.append("output tokens other than max_tokens: " + ", ".join(wrong))
    return lines


def single_table(runs: list[dict]) -> list[str]:
    """The single prompts: each run's TTFT and decode tok/s."""
    sizes = list(dict.fromkeys(size for r in runs for size in r["single"]))
    if not sizes:
        return []
    lines = [_row(["prompt"] + [f"{r['label']} {c}" for r in runs
                                for c in ("TTFT s", "decode tok/s")]),
             "|---" * (1 + 2 * len(runs)) + "|"]
    for size in sizes:
        figs = [r["single"].get(size, _MISSING) for r in runs]
        tokens = next((f["prompt_tokens"] for f in figs if f["prompt_tokens"]), "-")
        lines.append(_row([f"{size} words ({tokens} tokens)"] + [
            cell for f in figs for cell in (_num(f["ttft_s"]), _num(f["decode_tok_s"]))]))
    return lines


def report(runs: list[dict]) -> str:
    """Markdown: `chat_table`, then `single_table`."""
    single = single_table(runs)
    return "\n".join(chat_table(runs) + ([""] + single if single else []))
