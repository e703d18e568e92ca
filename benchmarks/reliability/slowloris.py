"""Slowloris: connections that stall, trickle or idle, held against the server while normal
requests run beside them. Reports, over time, how many of the held connections the server has
closed, its open file descriptors, and the latency of the normal requests.

    .venv/bin/python benchmarks/reliability/slowloris.py [--connections 2000] [--seconds 60]
        [--server-arg=--header-read-timeout=0 --server-arg=--max-connections=0 ...]

The held connections come from 127.0.0.2, the normal requests from 127.0.0.1. Each sends one of: nothing (silent), the start of a request's headers and no
more (stalled), a header byte every second (trickled), or a whole request and then nothing,
kept alive (idle keep-alive). ``--server-arg`` turns the limits off to see the old behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import httpx
from common import add_server_args, cpu_name, server

KINDS = ("silent", "stalled", "trickled", "keepalive")


async def hold(port: int, kind: str, closed: list[str], stop: asyncio.Event) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=("127.0.0.2", 0))
    except OSError:
        closed.append(kind)  # refused at connect (a full accept queue)
        return
    try:
        if kind in ("stalled", "trickled"):
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n"
                         + (b"X-Pad: " if kind == "trickled" else b""))
        elif kind == "keepalive":
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        while not stop.is_set():
            if kind == "trickled":
                writer.write(b"a")  # a header value that never ends
                await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(65536), 1.0)
            except asyncio.TimeoutError:
                continue
            if kind == "keepalive" and data and not data.startswith(b"HTTP/1.1 4"):
                continue  # its own answer; the connection stays open
            if not data:
                closed.append(kind)
                return
    except OSError:
        closed.append(kind)
    finally:
        writer.close()


def num_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def main(s, num_connections: int, seconds: float) -> None:
    stop = asyncio.Event()
    closed: list[str] = []
    pid = s.proc.pid
    print(f"CPU: {cpu_name()}; load average {os.getloadavg()[0]:.2f}")
    print(f"server fds before: {num_fds(pid)}")
    holders = [asyncio.create_task(hold(s.port, KINDS[i % 4], closed, stop))
               for i in range(num_connections)]
    latencies: list[float] = []
    start = time.monotonic()
    next_report = 5.0
    async with httpx.AsyncClient(base_url=s.url, timeout=30) as client:
        while (elapsed := time.monotonic() - start) < seconds:
            t0 = time.monotonic()
            try:
                r = await client.post("/v1/completions",
                                      json={"prompt": "hi", "max_tokens": 4})
                ok = r.status_code == 200
            except httpx.HTTPError as exc:
                ok = False
                print(f"normal request failed: {type(exc).__name__}: {exc}")
            latencies.append(time.monotonic() - t0 if ok else float("inf"))
            if elapsed >= next_report:
                by_kind = {k: closed.count(k) for k in KINDS}
                print(f"t={elapsed:5.1f}s  closed {len(closed)}/{num_connections} {by_kind}  "
                      f"server fds {num_fds(pid)}")
                next_report += 5.0
            await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*holders)
    good = sorted(x for x in latencies if x != float("inf"))
    print(f"normal requests beside them: {len(good)}/{len(latencies)} answered; "
          f"p50 {1000 * statistics.median(good):.1f} ms, "
          f"p99 {1000 * good[int(0.99 * (len(good) - 1))]:.1f} ms" if good else "none answered")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60)
    add_server_args(parser)
    args = parser.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 1024), hard))
    with server(args) as s:
        asyncio.run(main(s, args.connections, args.seconds))
