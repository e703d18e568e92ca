"""Recovery after kill -9 of the engine process, under N streams.

Starts ``radixserve serve`` (the embedded model unless ``--model`` / ``--mock-engine``), opens
N endless streams, kills the engine process with SIGKILL once all are flowing, and prints, from
the kill: when the streams got their error event (and whether ``[DONE]`` followed), when
/health answered 200 again, and when the first request after that succeeded.

    python benchmarks/recovery.py --streams 16 [--rounds 2] [--mock-engine] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "server"))
from server_proc import ServerProc  # noqa: E402


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


async def _stream(client: httpx.AsyncClient, flowing: asyncio.Event, counter: list[int],
                  n: int, max_tokens: int) -> tuple[float | None, bool]:
    """(monotonic time of the error event, whether [DONE] followed)."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    error_at, done, first = None, False, True
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream refused: {r.status_code} {(await r.aread())[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if first:
                first = False
                counter[0] += 1
                if counter[0] == n:
                    flowing.set()
            if data == "[DONE]":
                done = True
            elif error_at is None and "error" in json.loads(data):
                error_at = time.monotonic()
    return error_at, done


async def one_round(server: ServerProc, n: int, request_body: dict, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(base_url=server.url, limits=limits,
                                 timeout=httpx.Timeout(600)) as client:
        flowing, counter = asyncio.Event(), [0]
        tasks = [asyncio.ensure_future(_stream(client, flowing, counter, n, max_tokens)) for _ in range(n)]
        waiter = asyncio.ensure_future(flowing.wait())
        await asyncio.wait([waiter, *tasks], timeout=600, return_when=asyncio.FIRST_COMPLETED)
        if not flowing.is_set():
            for t in tasks:
                if t.done():
                    t.result()  # raises what ended it
            raise RuntimeError("the streams did not start")
        await asyncio.sleep(0.5)
        engine = server.engine_pid()
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        results = await asyncio.gather(*tasks)
        while True:
            r = await client.get("/health")
            if r.status_code == 200 and server.engine_pid() not in (engine, None):
                break
            await asyncio.sleep(0.01)
        healthy = time.monotonic()
        sent = time.monotonic()
        r = await client.post("/v1/completions", json=request_body)
        served = time.monotonic()
        assert r.status_code == 200, r.text
    errors = [t - killed for t, _ in results if t is not None]
    return {"errors": errors, "num_done": sum(d for _, d in results), "n": n,
            "health": healthy - killed, "first_ok": served - killed,
            "first_latency": served - sent}


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", default=None)
    ap.add_argument("--mock-engine", action="store_true")
    args = ap.parse_args()
    extra = ["--mock-engine", "--mock-step-ms", "20"] if args.mock_engine else []
    if args.model:
        extra += ["--model", args.model]
    started = time.monotonic()
    max_model_len = 100_000 if args.mock_engine else 2048
    server = ServerProc(*extra, "--max-model-len", str(max_model_len), timeout=600)
    print(f"server up in {time.monotonic() - started:.1f} s; CPU: {cpu_name()} "
          f"({os.cpu_count()} CPUs); engine: "
          f"{'mock' if args.mock_engine else args.model or 'embedded model'}")
    body = {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
    try:
        for i in range(args.rounds):
            res = asyncio.run(one_round(server, args.streams, body, max_model_len - 64))
            errs = res["errors"]
            print(f"round {i + 1}: {res['n']} streams; error events in {len(errs)} "
                  f"(first {_ms(min(errs))}, median {_ms(statistics.median(errs))}, "
                  f"last {_ms(max(errs))}), [DONE] in {res['num_done']}; /health 200 after "
                  f"{res['health']:.2f} s; first request after served at "
                  f"{res['first_ok']:.2f} s ({_ms(res['first_latency'])} itself)")
        metrics = httpx.get(f"{server.url}/metrics").text.splitlines()
        print(*(m for m in metrics if m.startswith("radixserve:engine_restarts_total")))
    finally:
        print(f"server exit code {server.stop()}")


if __name__ == "__main__":
    main()
