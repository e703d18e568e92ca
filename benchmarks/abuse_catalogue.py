"""Run the abusive-input catalogue (abuse_cases.py, beside this file) against a live server and
print one row per case: expected status, the status got, milliseconds, verdict. Afterwards
/load must show nothing pending, running, waiting or held in the KV cache.

Usage:
  python benchmarks/abuse_catalogue.py --url http://127.0.0.1:8000 [--fast] [--only SUBSTRING]
  python benchmarks/abuse_catalogue.py --start [--mock-engine]   # starts its own server

Exit status 1 if any case got another answer than expected, or something was left behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import httpx
from abuse_cases import catalogue
from abuse_runner import format_table, run_catalogue


def _start(mock: bool) -> tuple[subprocess.Popen, str]:
    port = 8123
    args = [sys.executable, "-m", "radixserve", "serve", "--port", str(port)]
    if mock:
        args.append("--mock-engine")
    env = {k: v for k, v in os.environ.items() if k != "RADIXSERVE_API_KEY"}
    proc = subprocess.Popen(args, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("the server exited during start-up")
        try:
            if httpx.get(f"{url}/version", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not start")


def _left_behind(url: str, timeout: float = 10.0) -> dict:
    """/load once nothing is in flight (aborts reach the engine asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        load = httpx.get(f"{url}/load", timeout=10).json()
        busy = {k: v for k, v in load.items() if k != "num_kv_blocks" and v}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--start", action="store_true", help="start a server on port 8123")
    parser.add_argument("--mock-engine", action="store_true", help="with --start")
    parser.add_argument("--fast", action="store_true", help="leave out the slow cases")
    parser.add_argument("--only", default=None, help="only cases whose name contains this")
    args = parser.parse_args()
    proc, url = _start(args.mock_engine) if args.start else (None, args.url)
    try:
        cases = [c for c in catalogue() if not (args.fast and c.is_slow)
                 and (args.only is None or args.only in c.name)]
        started = time.perf_counter()
        results = run_catalogue(url, cases)
        print(format_table(results))
        print(f"wall time {time.perf_counter() - started:.1f} s")
        busy = _left_behind(url)
        print(f"left behind: {busy or 'nothing'}")
        return int(any(not r.ok for r in results) or bool(busy))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    sys.exit(main())
