"""benchmarks/agent_trace.py's output: a markdown table per server (each request's TTFT,
prompt and cached tokens, and its TTFT over llama-server's for the same request), then the
figures issue 59 sets targets for, each with its ratio and whether it is met."""

from __future__ import annotations

import statistics

RS, LS = "radixserve", "llama-server"
# issue 59: turn 1 <= 0.6x llama-server's TTFT, turns 2-10 <= 0.5x, the first turn after a
# restart or a reload <= 0.25x of turn 1
TURN1, LATER, AFTER = 0.6, 0.5, 0.25


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _ttft(fig: dict | None) -> float | None:
    return None if fig is None else fig.get("ttft_s")


def _rows(run: dict, turns: int) -> list[tuple[str, str, dict]]:
    """(key, request, figures) of one server, in the order they were sent; the same request
    has the same key on every server."""
    rows = [(str(i + 1), str(i + 1), fig) for i, fig in enumerate(run["turns"])]
    nxt = turns + 1
    if restart := run.get("restart"):
        rows.append(("restart", f"{nxt} after a restart ({_started(restart)})",
                     restart["turn"]))
    if reload := run.get("reload"):
        rows.append(("reload-first", f"{nxt} under --models-dir, first (its load included)",
                     reload["first"]))
        warm = reload.get("warmup_ttft_s")
        rows.append(("reload", f"{nxt} after unload + load ({reload['load_s']:.1f} s"
                     + (f", warm-up {warm:.2f} s)" if warm else ")"), reload["turn"]))
    return rows


def _started(run: dict) -> str:
    warm = run.get("warmup_ttft_s")
    return f"ready in {run['ready_s']:.1f} s" + (f", warm-up {warm:.2f} s" if warm else "")


def server_table(label: str, run: dict, turns: int, peer: dict | None) -> list[str]:
    """One server's requests; the TTFT ratio to ``peer``'s same request where it made it."""
    peer_figs = {key: fig for key, _, fig in _rows(peer, turns)} if peer else {}
    head = ["request", "TTFT s", "prompt tokens", "cached tokens", "answer"]
    head += [f"TTFT / {LS}'s"] if peer else []
    lines = [f"### {label}", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for key, request, fig in _rows(run, turns):
        kind = "tool call" if fig.get("is_tool_call") else "text"
        cells = [request, _num(_ttft(fig)), _num(fig.get("prompt_tokens")),
                 _num(fig.get("cached_tokens")), kind]
        if peer:
            a, b = _ttft(fig), _ttft(peer_figs.get(key))
            cells.append(f"{a / b:.2f}x" if a and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", f"The trace's start: {_started(run)}."]


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "- | not measured"
    return f"{value:.2f}x | {'met' if value <= target else 'NOT met'}"


def target_lines(runs: dict, turns: int) -> list[str]:
    """Issue 59's targets: radixserve's figures over llama-server's or over its own turn 1."""
    rs, ls = runs.get(RS), runs.get(LS)
    lines = ["| target | figure | ratio | verdict |", "|---|---|---|---|"]
    first = _ttft(rs["turns"][0]) if rs else None
    if rs and ls:
        sizes = rs["turns"][0].get("prompt_tokens"), ls["turns"][0].get("prompt_tokens")
        if all(sizes) and abs(sizes[0] - sizes[1]) > 0.05 * max(sizes):
            lines.insert(0, f"WARNING: turn 1's prompt is {sizes[0]} tokens on {RS} and "
                            f"{sizes[1]} on {LS}: their chat templates did not render the same "
                            "prompt (tools dropped?), so the ratios compare different work.\n")
        lines.append(f"| turn 1 <= {TURN1}x {LS} | TTFT {_num(first)} s / "
                     f"{_num(_ttft(ls['turns'][0]))} s | "
                     f"{_verdict(first / _ttft(ls['turns'][0]), TURN1)} |")
        ratios = [_ttft(a) / _ttft(b) for a, b in zip(rs["turns"][1:], ls["turns"][1:])
                  if _ttft(a) and _ttft(b)]
        if ratios:
            met = sum(r <= LATER for r in ratios)
            lines.append(f"| turns 2-{turns} <= {LATER}x {LS} | median of {len(ratios)} turns "
                         f"(worst {max(ratios):.2f}x; {met} of {len(ratios)} met) | "
                         f"{_verdict(statistics.median(ratios), LATER)} |")
    if rs and first:
        for key, name in (("restart", "after a restart"), ("reload", "after unload + load")):
            if key in rs:
                t = _ttft(rs[key]["turn"])
                lines.append(f"| turn {turns + 1} {name} <= {AFTER}x turn 1 | TTFT {_num(t)} s "
                             f"/ {_num(first)} s | {_verdict(t / first if t else None, AFTER)} |")
    if ls and "restart" in ls and _ttft(ls["turns"][0]):
        t = _ttft(ls["restart"]["turn"])
        lines.append(f"\n{LS} keeps no prompt cache across a restart (its --slot-save-path "
                     "saves a slot only when asked, which agents do not): its turn "
                     f"{turns + 1} after a restart took {_num(t)} s, "
                     f"{t / _ttft(ls['turns'][0]):.2f}x its turn 1.")
    return lines


def report(runs: dict, turns: int) -> str:
    """Markdown: a table per server, then the targets."""
    lines = []
    for label, run in runs.items():
        peer = runs.get(LS) if label != LS else None
        lines += server_table(label, run, turns, peer) + [""]
    lines += ["### issue 59's targets", ""] + target_lines(runs, turns)
    return "\n".join(lines)
