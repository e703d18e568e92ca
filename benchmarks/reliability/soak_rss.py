"""A soak: steady streaming load for ``--seconds``, the RSS of the API and engine processes
sampled every second; prints both series' slope (least squares, MB per minute) and range.

    .venv/bin/python benchmarks/reliability/soak_rss.py [--seconds 300] [--streams 16] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from common import add_server_args, cpu_name, engine_pid, rss_mb, run, server, timed_stream


def slope_per_minute(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 2:
        return 0.0
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0


async def main(s, seconds: float, num_streams: int) -> None:
    api, eng = s.proc.pid, engine_pid(s)
    samples: list[tuple[float, float, float]] = []
    completed = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
        async def worker(i: int):
            nonlocal completed
            while time.monotonic() < deadline:
                body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 64,
                        "stream": True}
                if await timed_stream(client, body, []) == "[DONE]":
                    completed += 1

        async def sampler():
            start = time.monotonic()
            while time.monotonic() < deadline:
                samples.append((time.monotonic() - start, rss_mb(api), rss_mb(eng)))
                await asyncio.sleep(1)

        await asyncio.gather(sampler(), *(worker(i) for i in range(num_streams)))
    warm = samples[len(samples) // 5:]  # the first fifth is warm-up (caches, arenas)
    ts = [t for t, _, _ in warm]
    for name, col in (("API process", 1), ("engine process", 2)):
        ys = [row[col] for row in warm]
        print(f"  {name}: RSS {min(ys):.0f}-{max(ys):.0f} MB after warm-up, slope "
              f"{slope_per_minute(ts, ys):+.2f} MB/min (start {samples[0][col]:.0f} MB)")
    print(f"  {completed} streams completed in {seconds:.0f} s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--streams", type=int, default=16)
    add_server_args(p)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; engine: {'embedded model' if args.real else 'mock'}; "
          f"{args.streams} streams for {args.seconds:.0f} s")
    with server(args) as s:
        run(main(s, args.seconds, args.streams))
