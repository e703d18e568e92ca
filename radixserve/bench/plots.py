"""PNG plots of ``bench serve`` results (matplotlib, Agg backend, imported only here).

- `plot_run`: CDFs of TTFT, ITL and E2E latency of one run (``bench serve --plot``).
- `plot_compare` (``radixserve bench plot a.json b.json --out cmp.png``): the runs' CDFs
  overlaid; when the runs differ by concurrency, a second row with output throughput and p99
  TTFT against concurrency, one line per label.
"""

from __future__ import annotations

import argparse
import json

_LATENCIES = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E latency"))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="--result-json files of bench serve")
    p.add_argument("--out", required=True, help="the PNG to write")


def run(args: argparse.Namespace) -> int:
    results = []
    for path in args.results:
        try:
            with open(path) as f:
                result = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        if "records" not in result or "summary" not in result:
            raise ValueError(f"{path} is not a bench serve --result-json file")
        results.append(result)
    plot_compare(results, args.out)
    print(f"wrote {args.out}")
    return 0


def latencies_ms(result: dict, key: str) -> list[float]:
    """The completed requests' ``key`` latencies (ttft, e2e; itl: every gap) in ms."""
    out: list[float] = []
    for r in result["records"]:
        if not r["ok"]:
            continue
        value = r.get(key)
        if isinstance(value, list):
            out.extend(v * 1000 for v in value)
        elif value is not None:
            out.append(value * 1000)
    return out


def plot_run(result: dict, path: str) -> None:
    """Write the latency CDFs of one run to ``path``."""
    plot_compare([result], path)


def plot_compare(results: list[dict], path: str) -> None:
    """Write the overlaid CDFs of ``results`` (and the concurrency sweep, if any) to ``path``."""
    plt = _pyplot()
    concurrencies = {r["config"].get("concurrency") for r in results}
    sweep = len(concurrencies) > 1 and None not in concurrencies
    rows = 2 if sweep else 1
    fig, axes = plt.subplots(rows, 3, figsize=(15, 4.5 * rows), squeeze=False)
    for ax, (key, title) in zip(axes[0], _LATENCIES):
        for result in results:
            values = sorted(latencies_ms(result, key))
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=_run_name(result, sweep))
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests" if key != "itl" else "fraction of gaps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if sweep:
        _plot_sweep(axes[1], results)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_sweep(axes, results: list[dict]) -> None:
    lines: dict[str, list[tuple[int, float, float]]] = {}
    for r in results:
        s = r["summary"]
        lines.setdefault(r.get("label") or r["base_url"], []).append(
            (r["config"]["concurrency"], s["output_throughput"] or 0.0,
             s["ttft_ms"]["p99"] or 0.0))
    for label, points in lines.items():
        points.sort()
        xs = [p[0] for p in points]
        axes[0].plot(xs, [p[1] for p in points], marker="o", label=label)
        axes[1].plot(xs, [p[2] for p in points], marker="o", label=label)
    for ax, title in ((axes[0], "output tokens/s"), (axes[1], "p99 TTFT (ms)")):
        ax.set_title(f"{title} vs concurrency")
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[2].axis("off")


def _run_name(result: dict, with_concurrency: bool) -> str:
    name = result.get("label") or result["base_url"]
    c = result["config"].get("concurrency")
    return f"{name} c={c}" if with_concurrency else name


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
