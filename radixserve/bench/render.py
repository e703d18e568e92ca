"""``radixserve bench render``: speed of radixserve's ``POST /v1/chat/completions/render``.

The endpoint renders a chat completion request through the chat template and tokenizes it
(no engine work), so this measures the frontend's template + tokenizer path. Three fixed
request shapes: ``short`` (one user message, ~30 tokens), ``long`` (8 turns — user and
assistant alternating, ending on a user message — ~2,200 tokens of conversation text) and
``tools`` (8 tool definitions with JSON-schema parameters, ~900 tokens, and one user message).
For each shape × concurrency, ``--num-requests`` requests are sent by ``concurrency`` workers
(after a few warm-up requests); figures: requests/s and ms per request (mean, p50, p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from radixserve.bench.datasets import words
from radixserve.bench.metrics import json_safe, percentile

_WARMUP = 3


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--concurrency", default="1,16", help="comma-separated")
    p.add_argument("--num-requests", type=int, default=200, help="per shape and concurrency")
    p.add_argument("--shapes", default="short,long,tools", help="comma-separated subset")
    p.add_argument("--result-json", default=None)


def shapes() -> dict[str, dict]:
    """The request bodies, by shape name (deterministic)."""
    rng = random.Random(7)
    short = {"messages": [{"role": "user", "content": words(rng, 30)}]}
    turns = []
    for i in range(8):
        turns.append({"role": "user", "content": words(rng, 90)})
        if i < 7:
            turns.append({"role": "assistant", "content": words(rng, 215)})
    tools = {"messages": [{"role": "user", "content": "What is the weather in Paris tomorrow, "
                                                      "and book me a table for two there?"}],
             "tools": [_tool(*spec) for spec in _TOOL_SPECS]}
    return {"short": short, "long": {"messages": turns}, "tools": tools}


def run(args: argparse.Namespace) -> int:
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise ValueError(f"--concurrency must be comma-separated integers: "
                         f"{args.concurrency!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency values must be ≥ 1")
    if args.num_requests < 1:
        raise ValueError("--num-requests must be ≥ 1")
    names = [s.strip() for s in args.shapes.split(",")]
    unknown = set(names) - set(shapes())
    if unknown:
        raise ValueError(f"unknown --shapes {sorted(unknown)}; known: {sorted(shapes())}")
    rows = asyncio.run(_bench(args, names, levels))
    print(format_rows(rows))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(json_safe({"base_url": args.base_url, "config": vars(args),
                                 "results": rows}), f, indent=1)
    return 0 if all(r["completed"] for r in rows) else 1


def format_rows(rows: list[dict]) -> str:
    head = (f"{'shape':<7}{'tokens':>8}{'conc':>6}{'ok':>6}{'failed':>7}{'req/s':>9}"
            f"{'mean ms':>9}{'p50 ms':>9}{'p99 ms':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['shape']:<7}{r['tokens'] or '-':>8}{r['concurrency']:>6}"
                     f"{r['completed']:>6}{r['failed']:>7}{r['requests_per_s']:>9.1f}"
                     f"{r['mean_ms']:>9.2f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}")
    errors = {r["error"] for r in rows if r["error"]}
    lines += [f"error: {e}" for e in sorted(errors)]
    return "\n".join(lines)


async def _bench(args, names: list[str], levels: list[int]) -> list[dict]:
    import aiohttp

    url = f"{args.base_url.rstrip('/')}/v1/chat/completions/render"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    bodies = shapes()
    rows = []
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=60),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        for name in names:
            body = {**bodies[name], **({"model": args.model} if args.model else {})}
            for _ in range(_WARMUP):
                await _post(session, url, body)
            for c in levels:
                rows.append(await _level(session, url, body, name, c, args.num_requests))
    return rows


async def _level(session, url: str, body: dict, name: str, concurrency: int, n: int) -> dict:
    times: list[float] = []
    errors: list[str] = []
    tokens: list[int] = []
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            t = time.perf_counter()
            count, error = await _post(session, url, body)
            if error:
                errors.append(error)
            else:
                times.append(time.perf_counter() - t)
                tokens.append(count)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"shape": name, "concurrency": concurrency, "tokens": tokens[0] if tokens else None,
            "completed": len(times), "failed": len(errors),
            "requests_per_s": len(times) / wall if wall > 0 else float("nan"),
            "mean_ms": sum(times) / len(times) * 1000 if times else float("nan"),
            "p50_ms": percentile(times, 50) * 1000, "p99_ms": percentile(times, 99) * 1000,
            "error": errors[0] if errors else ""}


async def _post(session, url: str, body: dict) -> tuple[int, str]:
    """(rendered token count, "") or (0, the error)."""
    import aiohttp

    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return 0, f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return int((await resp.json()).get("count") or 0), ""
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    properties = {}
    for key, spec in props.items():
        kind, doc, *enum = spec.split("|")
        properties[key] = {"type": kind, "description": doc, **({"enum": enum} if enum else {})}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


# name, description, {param: "type|description[|enum values...]"}, required
_TOOL_SPECS = (
    ("get_weather", "Get the weather forecast for a city on a given day.",
     {"city": "string|The city name, e.g. Paris", "date": "string|The day, as YYYY-MM-DD",
      "unit": "string|Temperature unit|celsius|fahrenheit"}, ["city"]),
    ("search_web", "Search the web and return the top results with titles and snippets.",
     {"query": "string|The search query", "max_results": "integer|How many results, 1 to 20",
      "language": "string|Two-letter language code of the results"}, ["query"]),
    ("send_email", "Send an email on behalf of the user.",
     {"to": "string|Recipient address", "subject": "string|Subject line",
      "body": "string|Plain-text body", "cc": "string|Comma-separated copy addresses"},
     ["to", "subject", "body"]),
    ("create_event", "Create an event in the user's calendar.",
     {"title": "string|Event title", "start": "string|Start time, ISO 8601",
      "end": "string|End time, ISO 8601", "location": "string|Where it takes place",
      "reminder": "integer|Minutes before the start to remind the user"}, ["title", "start"]),
    ("query_database", "Run a read-only SQL query on the sales database.",
     {"sql": "string|A single SELECT statement", "limit": "integer|Most rows to return",
      "format": "string|Result format|table|csv|json"}, ["sql"]),
    ("translate_text", "Translate a text into another language.",
     {"text": "string|The text to translate", "target": "string|Target language code",
      "source": "string|Source language code, detected when omitted",
      "formality": "string|Register of the translation|formal|informal|default"},
     ["text", "target"]),
    ("get_stock_price", "Get the latest price and daily change of a stock.",
     {"ticker": "string|The ticker symbol, e.g. AAPL",
      "exchange": "string|The exchange|NASDAQ|NYSE|LSE|XETRA"}, ["ticker"]),
    ("book_restaurant", "Book a table at a restaurant.",
     {"restaurant": "string|Restaurant name", "city": "string|City of the restaurant",
      "time": "string|Reservation time, ISO 8601", "party_size": "integer|Number of guests",
      "notes": "string|Special requests such as allergies"},
     ["restaurant", "time", "party_size"]),
)
