"""Hostile files against the API process (issue 62 items 4 and 6): GGUFs whose counts lie in a
``--models-dir`` (listed by /api/tags while /health is timed), and the Responses store's file
(a -shm truncated while the server runs, a cycle in a stored chain). Each case starts its own
server (the mock engine) and prints how it was answered and whether the server lived.

    .venv/bin/python benchmarks/reliability/file_attacks.py
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time

import httpx
from common import add_server_args, cpu_name, server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from hostile_gguf import ALL


def gguf_listing(args) -> None:
    folder = tempfile.mkdtemp(prefix="radixserve-hostile-")
    for name, build in ALL.items():
        with open(os.path.join(folder, name.replace(" ", "-") + ".gguf"), "wb") as f:
            f.write(build())
    with server(args, "--models-dir", folder) as s:
        worst, stop = [0.0], threading.Event()

        def probe():
            while not stop.is_set():
                t = time.monotonic()
                httpx.get(f"{s.url}/health", timeout=60)
                worst[0] = max(worst[0], time.monotonic() - t)
                time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        t = time.monotonic()
        r = httpx.get(f"{s.url}/api/tags", timeout=120)
        took = time.monotonic() - t
        stop.set()
        prober.join()
        formats = sorted({m["details"]["format"] for m in r.json()["models"]})
        print(f"/api/tags over {len(ALL)} lying GGUFs: HTTP {r.status_code} in {took:.2f} s "
              f"(formats {formats}); slowest /health meanwhile {worst[0] * 1000:.0f} ms; "
              f"server alive: {s.proc.poll() is None}")


def store_attacks(args) -> None:
    folder = tempfile.mkdtemp(prefix="radixserve-store-")
    path = os.path.join(folder, "responses.db")
    body = {"input": "hi", "max_output_tokens": 3}
    with server(args, "--response-store", path) as s:
        first = httpx.post(f"{s.url}/v1/responses", json=body, timeout=60).json()
        if os.path.exists(path + "-shm"):
            os.truncate(path + "-shm", 0)
        r = httpx.post(f"{s.url}/v1/responses", json={**body, "previous_response_id":
                                                      first["id"]}, timeout=60)
        print(f"-shm truncated while running: next answer HTTP {r.status_code}, store "
              f"{r.json().get('store')}; server alive: {s.proc.poll() is None} "
              f"(-shm present: {os.path.exists(path + '-shm')})")
        second = r.json()
    db = sqlite3.connect(path)  # the corrupt file: the first continues the second
    with db:
        db.execute("UPDATE responses SET previous_id = ? WHERE id = ?",
                   (second["id"], first["id"]))
    db.close()
    with server(args, "--response-store", path) as s:
        t = time.monotonic()
        r = httpx.post(f"{s.url}/v1/responses", json={**body, "previous_response_id":
                                                      second["id"]}, timeout=60)
        took = time.monotonic() - t
        after = httpx.get(f"{s.url}/v1/responses/{first['id']}", timeout=10)
        print(f"a cycle in a stored chain: HTTP {r.status_code} in {took:.2f} s; a later "
              f"GET: HTTP {after.status_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_args(parser)
    args = parser.parse_args()
    print(cpu_name())
    gguf_listing(args)
    store_attacks(args)


if __name__ == "__main__":
    main()
