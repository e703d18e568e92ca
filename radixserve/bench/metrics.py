"""Per-request records of ``radixserve bench serve`` and the summary figures made from them.

Times are seconds in the records and milliseconds in the summary. Definitions:

- TTFT: request sent → first chunk with non-empty content (or reasoning) text.
- ITL: gaps between successive content chunks. A chunk that carries several tokens (servers
  may batch them; a character split across tokens arrives as one chunk) counts as one gap, so
  ITL is per chunk; TPOT is per token. Chunks read from the socket together share one time.
- TPOT: (E2E − TTFT) / (output tokens − 1), for requests with more than one output token.
- E2E: request sent → end of the stream.
- Output tokens: ``usage.completion_tokens`` when the server sends usage, else the number of
  content chunks. Prompt tokens: ``usage.prompt_tokens``, else the prompt's word count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)

# (queries, hits) counter names, in tokens, of the servers that expose them.
_CACHE_COUNTERS = (
    ("radixserve:prefix_cache_queries_total", "radixserve:prefix_cache_hits_total"),
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
)


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. ``ok`` false: ``error`` says why, timings may be
    partial. ``start`` is relative to the start of the run."""

    ok: bool = False
    error: str = ""
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    usage: bool = False  # token counts came from the server's usage
    output_len: int = 0  # max_tokens asked
    tag: str = ""
    conversation: int = 0
    turn: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation (numpy's default);
    NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats_ms(values: list[float]) -> dict[str, float]:
    """mean and the `PERCENTILES` of ``values`` (seconds), in ms; NaN when empty."""
    out = {"mean": sum(values) / len(values) * 1000 if values else math.nan}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q) * 1000
    return out


def summarize(records: list[RequestRecord], duration: float,
              cache: tuple[float, float] | None = None,
              spec: tuple[float, float, float] | None = None) -> dict:
    """The summary figures of a run that took ``duration`` seconds. ``cache``: the server's
    prefix-cache (queries, hits) deltas over the run, when it exposes them; ``spec``: its
    speculative decoding (drafts, drafted tokens, accepted tokens) deltas. The mean accepted
    length is the tokens a drafting step emits: 1 + accepted / drafts."""
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    cached = [r for r in done if r.cached_tokens is not None]
    cached_prompt = sum(r.prompt_tokens for r in cached)
    summary = {
        "duration_s": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "ttft_ms": stats_ms([r.ttft for r in done if r.ttft is not None]),
        "itl_ms": stats_ms([gap for r in done for gap in r.itl]),
        "tpot_ms": stats_ms([t for r in done if (t := r.tpot) is not None]),
        "e2e_ms": stats_ms([r.e2e for r in done if r.e2e is not None]),
        "cache_hit_rate_server": None,
        "cache_hit_rate_usage": None,
        "errors": _error_counts(records),
    }
    if cache is not None and cache[0] > 0:
        summary["cache_hit_rate_server"] = cache[1] / cache[0]
        summary["cache_queries_tokens"], summary["cache_hits_tokens"] = cache
    if spec is not None and spec[0] > 0:
        summary["spec_acceptance_rate"] = spec[2] / spec[1] if spec[1] else 0.0
        summary["spec_mean_accepted_len"] = 1.0 + spec[2] / spec[0]
    if cached and cached_prompt > 0:
        summary["cache_hit_rate_usage"] = sum(r.cached_tokens for r in cached) / cached_prompt
    return summary


def format_table(summary: dict, title: str = "bench serve") -> str:
    """The summary as a fixed-width text table."""
    rows = [("Duration (s)", f"{summary['duration_s']:.2f}"),
            ("Completed requests", str(summary["completed"])),
            ("Failed requests", str(summary["failed"])),
            ("Input tokens", str(summary["input_tokens"])),
            ("Output tokens", str(summary["output_tokens"])),
            ("Requests/s", f"{summary['request_throughput']:.2f}"),
            ("Output tokens/s", f"{summary['output_throughput']:.1f}"),
            ("Total tokens/s", f"{summary['total_token_throughput']:.1f}")]
    if summary.get("cache_hit_rate_server") is not None:
        hits = (f"{summary['cache_hit_rate_server']:.1%} ({summary['cache_hits_tokens']:.0f}"
                f" / {summary['cache_queries_tokens']:.0f} tokens)")
        rows.append(("Prefix cache hits (server)", hits))
    if summary.get("cache_hit_rate_usage") is not None:
        rows.append(("Cached prompt tokens (usage)", f"{summary['cache_hit_rate_usage']:.1%}"))
    if summary.get("spec_mean_accepted_len") is not None:
        rows.append(("Spec. acceptance rate", f"{summary['spec_acceptance_rate']:.1%}"))
        rows.append(("Spec. mean accepted length", f"{summary['spec_mean_accepted_len']:.2f}"))
    width = 30
    lines = [f"{'=' * 18} {title} {'=' * max(3, 40 - len(title))}"]
    lines += [f"{name:<{width}}{value:>20}" for name, value in rows]
    head = "".join(f"{h:>10}" for h in ("mean", *(f"p{q}" for q in PERCENTILES)))
    lines.append(f"{'latency (ms)':<{width - 10}}{head}")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"),
                      ("e2e_ms", "E2E")):
        s = summary[key]
        cells = "".join(f"{s[k]:>10.2f}" for k in ("mean", *(f"p{q}" for q in PERCENTILES)))
        lines.append(f"{name:<{width - 10}}{cells}")
    for message, count in list(summary.get("errors", {}).items())[:5]:
        lines.append(f"error ×{count}: {message[:90]}")
    lines.append("=" * len(lines[0]))
    return "\n".join(lines)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition → {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)", line)
        if m:
            try:
                out[m[1]] = out.get(m[1], 0.0) + float(m[3])
            except ValueError:
                continue
    return out


_SPEC_COUNTERS = tuple(f"radixserve:spec_decode_num_{n}_total"
                       for n in ("drafts", "draft_tokens", "accepted_tokens"))


def spec_counters(metrics: dict[str, float]) -> tuple[float, float, float] | None:
    """(drafts, drafted tokens, accepted tokens) from parsed /metrics; None if not exposed."""
    if all(name in metrics for name in _SPEC_COUNTERS):
        return tuple(metrics[name] for name in _SPEC_COUNTERS)
    return None


def cache_counters(metrics: dict[str, float]) -> tuple[float, float] | None:
    """(prefix-cache queries, hits) in tokens from parsed /metrics; None if not exposed."""
    for queries, hits in _CACHE_COUNTERS:
        if queries in metrics and hits in metrics:
            return metrics[queries], metrics[hits]
    return None


def _error_counts(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.ok:
            counts[r.error] = counts.get(r.error, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def json_safe(obj):
    """``obj`` with NaN/inf floats replaced by None (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
