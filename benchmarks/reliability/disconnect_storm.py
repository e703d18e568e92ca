"""A disconnect storm: N streams all leave mid-way; what is left running afterwards.

    .venv/bin/python benchmarks/reliability/disconnect_storm.py [--streams 200] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from common import add_server_args, cpu_name, load, run, server, wait_idle


async def one(client: httpx.AsyncClient, events_before_leaving: int) -> int:
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "stream": True}
    seen = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= events_before_leaving:
                    break  # leaving the block closes the connection mid-stream
    return seen


async def main(url: str, num_streams: int) -> None:
    limits = httpx.Limits(max_connections=num_streams + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        start = time.monotonic()
        seen = await asyncio.gather(*(one(client, 3 + i % 7) for i in range(num_streams)))
        left = time.monotonic() - start
    during = load(url)
    idle = wait_idle(url)
    after = load(url)
    print(f"{num_streams} streams left after {min(seen)}-{max(seen)} events each "
          f"({left:.1f} s); /load just after: {during['num_requests_running']} running, "
          f"{during['num_pending_requests']} pending")
    print(f"  idle after {idle:.2f} s: {after['num_requests_running']} running, "
          f"{after['num_requests_waiting']} waiting, {after['num_pending_requests']} pending, "
          f"KV usage {after['kv_cache_usage']:.3f}")
    metrics = httpx.get(f"{url}/metrics").text
    aborts = [line for line in metrics.splitlines()
              if line.startswith("radixserve:request_aborts_total")]
    print(f"  {aborts[0] if aborts else 'no abort counter'}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=200)
    add_server_args(p)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; engine: {'embedded model' if args.real else 'mock'}")
    with server(args, "--max-num-seqs", "1024") as s:
        run(main(s.url, args.streams))
