"""A CPU hog beside the server: request latency quiet and with one busy process per core,
16 concurrent streams, the embedded model (issue 31's contention case).

    .venv/bin/python benchmarks/reliability/contention.py [--streams 16] [--tokens 32]
        [--hogs 1] [--server-arg=--threads=2]

Per phase (quiet, then with ``--hogs`` processes spinning on the server's cores) it prints
each request's latency as p50 / p99 / max and the ratio to the quiet phase; the target is
every request within 3x its quiet latency. The hogs are plain Python busy loops, not niced.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time

import httpx
from common import add_server_args, cpu_name, server


def hog(stop) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


async def one(client: httpx.AsyncClient, tokens: int) -> float:
    t0 = time.monotonic()
    r = await client.post("/v1/completions", json={
        "prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True})
    r.raise_for_status()
    return time.monotonic() - t0


async def phase(url: str, streams: int, tokens: int, rounds: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=streams + 4)) as client:
        await one(client, 4)  # warm
        out: list[float] = []
        for _ in range(rounds):
            out += await asyncio.gather(*(one(client, tokens) for _ in range(streams)))
        return out


def describe(name: str, xs: list[float], quiet: list[float] | None) -> str:
    xs = sorted(xs)
    p50, p99 = statistics.median(xs), xs[int(0.99 * (len(xs) - 1))]
    line = f"{name:>6}: p50 {p50:.2f} s  p99 {p99:.2f} s  max {xs[-1]:.2f} s"
    if quiet:
        q50 = statistics.median(quiet)
        line += f"  ({p50 / q50:.2f}x quiet p50, max {xs[-1] / q50:.2f}x)"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=1)
    add_server_args(parser)
    args = parser.parse_args()
    args.real = True
    print(f"CPU: {cpu_name()}; load average {os.getloadavg()[0]:.2f} before")
    with server(args) as s:
        quiet = asyncio.run(phase(s.url, args.streams, args.tokens, args.rounds))
        print(describe("quiet", quiet, None))
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        hogs = [ctx.Process(target=hog, args=(stop,)) for _ in range(args.hogs)]
        for p in hogs:
            p.start()
        try:
            time.sleep(1.0)
            busy = asyncio.run(phase(s.url, args.streams, args.tokens, args.rounds))
        finally:
            stop.set()
            for p in hogs:
                p.join()
        print(describe("hog", busy, quiet))
        print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
