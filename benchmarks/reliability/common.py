"""What the reliability benchmarks share: a server to run against, streams that time their
events, /load polling and the RSS of the API and engine processes.

Each script starts its own ``radixserve serve`` (the mock engine unless ``--real``: the
embedded model) on a free port, or runs against ``--url`` of one already running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "server"))
from server_proc import ServerProc  # noqa: E402


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--real", action="store_true",
                        help="the embedded model instead of the mock engine")
    parser.add_argument("--mock-step-ms", default="10", help="the mock's step time")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra `radixserve serve` argument (repeatable)")


@contextmanager
def server(args: argparse.Namespace, *extra: str):
    flags = [] if args.real else ["--mock-engine", "--mock-step-ms", args.mock_step_ms]
    s = ServerProc(*flags, *extra, *args.server_arg, timeout=600)
    try:
        yield s
    finally:
        s.stop()


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    return platform.processor()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def engine_pid(s: ServerProc) -> int:
    for pid in s.engine_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                return pid
    raise RuntimeError("no engine process")


def load(url: str) -> dict:
    return httpx.get(f"{url}/load", timeout=10).json()


def wait_idle(url: str, timeout: float = 30) -> float:
    """Seconds until /load shows nothing pending, running, waiting or in KV (inf: never)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        s = load(url)
        if (s["num_pending_requests"], s["num_requests_running"], s["num_requests_waiting"],
                s["kv_cache_usage"]) == (0, 0, 0, 0):
            return time.monotonic() - start
        time.sleep(0.05)
    return float("inf")


async def timed_stream(client: httpx.AsyncClient, body: dict, times: list[float]) -> str:
    """A streamed completion; appends each event's arrival time; returns its last event."""
    last = ""
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return f"HTTP {r.status_code}"
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic())
                last = line[6:]
    return last


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def summary(values: list[float], unit: float = 1000, name: str = "ms") -> str:
    if not values:
        return "n/a"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return (f"p50 {statistics.median(values) * unit:.1f} {name}, p99 {p99 * unit:.1f} {name}, "
            f"max {values[-1] * unit:.1f} {name}")


def run(coro):
    return asyncio.run(coro)


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"


def report_attacks(title: str, args: argparse.Namespace, rows: list[tuple[str, str, bool]]) -> int:
    """Print each attack's (name, what happened, held) under a header naming the engine, the
    CPU and the commit; the exit status: 1 if any broke."""
    print(f"# {title}, {'real' if args.real else 'mock'} engine, {cpu_name()}, git {git_rev()}")
    for name, what, held in rows:
        print(f"{'held ' if held else 'BROKE'}  {name:28s} {what}")
    broke = sum(not held for _, _, held in rows)
    print(f"{len(rows) - broke} of {len(rows)} held")
    return 1 if broke else 0
