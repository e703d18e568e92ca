"""A hung engine under N streams: how fast it is noticed, and how fast service returns.

    .venv/bin/python benchmarks/reliability/stall_detect.py [--streams 16] [--stall-timeout 2]
        [--rounds 3] [--real]

With N streams flowing, --rounds times each:
  hang   the engine is stopped (SIGSTOP) for good: the time from SIGSTOP until /health
         answered 503, until every stream had ended (with its error event), until /health
         answered 200 again (a new engine), and until the first request after that succeeded.
  pause  the engine is stopped for half the stall limit, then continued (SIGCONT): /health
         must stay 200 and no stream may fail; reported: the time from SIGCONT until every
         stream had its next token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import time

import httpx
from common import add_server_args, cpu_name, engine_pid, git_rev, run, server

from radixserve.cluster.engine_supervisor import RestartPolicy

POLL_S = 0.01


async def _stream(client: httpx.AsyncClient, max_tokens: int, times: list[float],
                  last: list[str]) -> None:
    """A streamed completion: each event's arrival time into ``times``, its data into
    ``last[0]`` (the final one is [DONE]; the one before it the error, if any)."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"stream refused: {r.status_code} {(await r.aread())[:300]}")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic())
                if line != "data: [DONE]":
                    last[0] = line[6:]


async def _start_streams(client, n: int, max_tokens: int):
    times = [[] for _ in range(n)]
    lasts = [[""] for _ in range(n)]
    tasks = [asyncio.create_task(_stream(client, max_tokens, t, last))
             for t, last in zip(times, lasts)]
    while not all(times):
        await asyncio.sleep(POLL_S)
    await asyncio.sleep(0.3)  # all flowing
    return tasks, times, lasts


async def _stop(tasks) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def pause_round(client, pid: int, n: int, max_tokens: int, stall_s: float) -> float:
    """Seconds from SIGCONT until every stream had a token again."""
    tasks, times, lasts = await _start_streams(client, n, max_tokens)
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while time.monotonic() - stopped < stall_s / 2:
            r = await client.get("/health")
            assert r.status_code == 200, f"a pause under the limit turned /health {r.text}"
            await asyncio.sleep(POLL_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    continued = time.monotonic()
    while not all(t[-1] > continued for t in times):
        assert time.monotonic() - continued < 30, "the streams did not resume"
        await asyncio.sleep(0.001)
    resumed = max(next(x for x in t if x > continued) for t in times) - continued
    assert all("error" not in json.loads(last[0]) for last in lasts), "a stream failed"
    await _stop(tasks)
    return resumed


async def hang_round(client, s, n: int, max_tokens: int) -> dict[str, float]:
    tasks, times, lasts = await _start_streams(client, n, max_tokens)
    pid = engine_pid(s)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    while (r := await client.get("/health")).status_code == 200:
        await asyncio.sleep(POLL_S)
    unhealthy = time.monotonic() - stopped
    reason = r.json()["reason"]
    await asyncio.gather(*tasks)
    ended = max(t[-1] for t in times) - stopped
    assert all("no progress" in json.loads(last[0])["error"]["message"] for last in lasts)
    while (await client.get("/health")).status_code != 200 or engine_pid(s) == pid:
        await asyncio.sleep(POLL_S)
    healthy = time.monotonic() - stopped
    r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200, r.text
    return {"503": unhealthy, "streams ended": ended, "200 again": healthy,
            "first request served": time.monotonic() - stopped, "reason": reason}


async def main(s, args) -> None:
    max_tokens = 1000 if args.real else 900_000
    limits = httpx.Limits(max_connections=args.streams + 8)
    pauses, hangs = [], []
    async with httpx.AsyncClient(base_url=s.url, limits=limits, timeout=60) as client:
        # the hangs first, each on the engine the previous one's restart started: a pause is
        # measured as one long step, which raises its engine's limit (4 x the pause) for 10
        # minutes, so the pauses come after, on the last engine
        for _ in range(args.rounds):
            hangs.append(await hang_round(client, s, args.streams, max_tokens))
        for _ in range(args.rounds):
            pauses.append(await pause_round(client, engine_pid(s), args.streams, max_tokens,
                                            args.stall_timeout))
    print(f"  hang, from SIGSTOP ({hangs[0]['reason']!r}):")
    for i, h in enumerate(hangs):
        # every engine here hangs within 60 s of its start: the restarts are consecutive
        # failures, so each after the first waits out the supervisor's back-off
        back_off = RestartPolicy().delay(i)
        print(f"    round {i + 1}: /health 503 after {h['503']:.2f} s, streams ended "
              f"{h['streams ended']:.2f} s, /health 200 again {h['200 again']:.2f} s "
              f"(restart back-off {back_off:g} s: {h['200 again'] - h['503'] - back_off:.2f} "
              f"s of restart), first request served {h['first request served']:.2f} s")
    print(f"  pause of {args.stall_timeout / 2:g} s (under the limit): nothing failed; every "
          f"stream's next token {_figures([p * 1000 for p in pauses], 'ms')} after SIGCONT")


def _figures(values: list[float], unit: str = "s") -> str:
    if len(values) == 1:
        return f"{values[0]:.2f} {unit}"
    return (f"median {statistics.median(values):.2f} {unit} (min {min(values):.2f}, "
            f"max {max(values):.2f}; {len(values)} rounds)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--stall-timeout", type=float, default=2.0,
                   help="the server's --engine-stall-timeout")
    p.add_argument("--rounds", type=int, default=3)
    add_server_args(p)
    args = p.parse_args()
    print(f"CPU: {cpu_name()}; engine: "
          f"{'embedded model' if args.real else f'mock, {args.mock_step_ms} ms steps'}; "
          f"{args.streams} streams; --engine-stall-timeout {args.stall_timeout:g}; "
          f"rev {git_rev()}")
    extra = ["--engine-stall-timeout", str(args.stall_timeout)]
    if not args.real:
        extra += ["--max-model-len", "1000000"]
    with server(args, *extra) as s:
        run(main(s, args))
