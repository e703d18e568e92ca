"""Streams' inter-token gaps while abusive requests are refused (issue 17 rows A, E, F).

Streams flow throughout; each abuse is sent in turn, and the script prints how it was answered
(status, time) and the largest gap any stream saw while it was being handled, beside the gaps
of a quiet window; then the API process's RSS before and after (memory taken is returned).
The overload case sends 64 concurrent 4,000-token prompts: the 429s and the admitted requests'
latency.

    .venv/bin/python benchmarks/reliability/abuse_gaps.py [--streams 8] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from common import add_server_args, cpu_name, gaps, rss_mb, run, server, summary, wait_idle

MB = 2**20


def abuses() -> list[tuple[str, str, bytes]]:
    chat = json.dumps({"messages": [{"role": "user", "content": "hello world " * 2_600_000}],
                       "max_tokens": 4}).encode()
    prompt = json.dumps({"prompt": "x " * 15_000_000, "max_tokens": 4}).encode()
    many = json.dumps({"prompt": [f"prompt number {i}" for i in range(10_000)],
                       "max_tokens": 4}).encode()
    tokenize = json.dumps({"prompt": "hello world " * 850_000}).encode()
    return [(f"chat body {len(chat) / MB:.0f} MB", "/v1/chat/completions", chat),
            (f"completion prompt {len(prompt) / MB:.0f} MB", "/v1/completions", prompt),
            ("10,000-prompt list", "/v1/completions", many),
            (f"/tokenize {len(tokenize) / MB:.0f} MB", "/tokenize", tokenize)]


async def flowing(client, times: list[float], stop: asyncio.Event) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8000, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic())
            if stop.is_set():
                return


def window_gaps(all_times: list[list[float]], start: float, end: float) -> list[float]:
    out = []
    for times in all_times:
        inside = [start, *(t for t in times if start <= t <= end), end]
        out += gaps(inside)
    return out


async def overload(url: str, n: int = 64) -> None:
    body = {"prompt": "hello " * 4000, "max_tokens": 16}
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=n + 4)) as client:
        async def one():
            t = time.monotonic()
            r = await client.post("/v1/completions", json=body)
            return r.status_code, time.monotonic() - t, r.headers.get("retry-after")

        results = await asyncio.gather(*(one() for _ in range(n)))
    ok = [t for code, t, _ in results if code == 200]
    refused = [ra for code, _, ra in results if code == 429]
    print(f"overload, {n} concurrent 4,000-token prompts: {len(ok)} admitted "
          f"(latency {summary(ok, 1, 's')}), {len(refused)} got 429 (Retry-After "
          f"{sorted(set(refused))}), other {n - len(ok) - len(refused)}")


async def main(url: str, api_pid: int, num_streams: int) -> None:
    payloads = abuses()
    rss_before = rss_mb(api_pid)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        stop = asyncio.Event()
        times = [[] for _ in range(num_streams)]
        tasks = [asyncio.ensure_future(flowing(client, t, stop)) for t in times]
        await asyncio.sleep(2)
        t0 = time.monotonic()
        await asyncio.sleep(2)
        print(f"quiet window: gaps {summary(window_gaps(times, t0, time.monotonic()))}")
        for name, path, raw in payloads:
            start = time.monotonic()
            r = await client.post(path, content=raw, headers={"content-type": "application/json"})
            took = time.monotonic() - start
            await asyncio.sleep(0.05)
            g = window_gaps(times, start, time.monotonic())
            code = r.json().get("error", {}).get("code") if r.status_code != 200 else "ok"
            print(f"{name}: {r.status_code} {code} in {took:.2f} s; stream gaps meanwhile "
                  f"{summary(g)}")
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    wait_idle(url)
    await asyncio.sleep(1)
    print(f"API process RSS: {rss_before:.0f} MB before the abuse, {rss_mb(api_pid):.0f} MB "
          f"after")
    await overload(url)
    print(f"idle again after {wait_idle(url, 120):.2f} s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=8)
    add_server_args(p)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; engine: {'embedded model' if args.real else 'mock'}")
    extra = [] if args.real else ["--mock-max-seqs", "24"]
    with server(args, *extra) as s:
        run(main(s.url, s.proc.pid, args.streams))
