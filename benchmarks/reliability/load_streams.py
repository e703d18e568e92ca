"""512 concurrent streams: how many complete, /health latency throughout, idle afterwards.

    .venv/bin/python benchmarks/reliability/load_streams.py [--streams 512] [--tokens 32] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time

import httpx
from common import add_server_args, cpu_name, run, server, summary, timed_stream, wait_idle


def probe(url: str, stop, out) -> None:
    """/health every 100 ms from a process of its own (the streams' client loop is busy)."""
    latencies = []
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            t = time.monotonic()
            client.get(f"{url}/health")
            latencies.append(time.monotonic() - t)
            time.sleep(0.1)
    out.put(latencies)


async def main(url: str, num_streams: int, max_tokens: int) -> None:
    limits = httpx.Limits(max_connections=num_streams + 8)
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    prober = ctx.Process(target=probe, args=(url, stop, out))
    prober.start()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
        times = [[] for _ in range(num_streams)]
        start = time.monotonic()
        lasts = await asyncio.gather(*(timed_stream(client, body, t) for t in times),
                                     return_exceptions=True)
        wall = time.monotonic() - start
    stop.set()
    health = out.get(timeout=60)
    prober.join()
    done = sum(last == "[DONE]" for last in lasts)
    failed = [repr(x)[:80] for x in lasts if x != "[DONE]"][:3]
    print(f"{num_streams} streams x {max_tokens} tokens: {done} completed in {wall:.1f} s "
          f"{failed or ''}")
    print(f"  /health during the load: {summary(health)} ({len(health)} probes)")
    print(f"  idle (0 pending, running, waiting, KV) {wait_idle(url):.2f} s after the last")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--tokens", type=int, default=32)
    add_server_args(p)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; engine: {'embedded model' if args.real else 'mock'}")
    with server(args, "--max-num-seqs", "1024") as s:
        run(main(s.url, args.streams, args.tokens))
