"""Requests whose responses dwarf them (issue 62 item 8): how each is answered, the response's
size, and /health's latency while it is built and sent.

A 20 kB ``echo`` + ``prompt_logprobs: 20`` + ``logprobs: 20`` + ``n: 16`` completion on a
4,000-token prompt once came back as 126.6 MB and held the event loop (and so /health) for
6.5 s. Each attack is sent while /health is polled every 20 ms; the script prints the status,
the body's size, the time taken and /health's worst latency meanwhile, beside a quiet
window's. The mock engine scores no prompts, so this runs on the embedded model.

    .venv/bin/python benchmarks/reliability/response_size_attacks.py [--server-arg ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from common import add_server_args, cpu_name, run, server, summary

MB = 2**20
PROMPT = "The quick brown fox jumps over the lazy dog. " * 400  # ~4,000 tokens
SHORT = "The quick brown fox jumps over the lazy dog. " * 100  # ~1,000 tokens


def attacks() -> list[tuple[str, str, dict]]:
    scored = {"echo": True, "prompt_logprobs": 20, "logprobs": 20, "max_tokens": 16}
    messages = [{"role": "user", "content": PROMPT}]
    return [
        ("completion, 4k-token prompt, echo+prompt_logprobs 20+logprobs 20, n 16",
         "/v1/completions", {**scored, "prompt": PROMPT, "n": 16}),
        ("chat logprobs top 20, n 16, max_tokens 4000", "/v1/chat/completions",
         {"messages": messages, "logprobs": True, "top_logprobs": 20, "n": 16,
          "max_tokens": 4000}),
        ("the same completion on a 1k-token prompt, n 4 (allowed, ~8 MB)", "/v1/completions",
         {**scored, "prompt": SHORT, "n": 4}),
    ]


async def poll_health(client: httpx.AsyncClient, latencies: list[float],
                      stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        await client.get("/health")
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(0.02)


async def health_during(url: str, work) -> tuple[object, list[float]]:
    """``work(client)``'s result and /health's latencies while it ran (its own connection)."""
    latencies: list[float] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=600) as probe, \
            httpx.AsyncClient(base_url=url, timeout=600) as client:
        poller = asyncio.ensure_future(poll_health(probe, latencies, stop))
        try:
            result = await work(client)
        finally:
            stop.set()
            await poller
    return result, latencies


async def main(url: str) -> None:
    _, quiet = await health_during(url, lambda _: asyncio.sleep(2))
    print(f"quiet window: /health {summary(quiet)}")
    for name, path, body in attacks():
        raw = json.dumps(body).encode()

        async def send(client, path=path, raw=raw):
            start = time.monotonic()
            r = await client.post(path, content=raw,
                                  headers={"content-type": "application/json"})
            return r, time.monotonic() - start

        (r, took), latencies = await health_during(url, send)
        detail = "ok" if r.status_code == 200 else r.json()["error"]["message"][:160]
        print(f"{name} ({len(raw) / 1000:.0f} kB request): {r.status_code} "
              f"{len(r.content) / MB:.1f} MB in {took:.2f} s; /health {summary(latencies)}\n"
              f"    {detail}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_server_args(p)
    args = p.parse_args()
    args.real = True  # the mock engine refuses prompt_logprobs
    print(f"CPU: {cpu_name()}; engine: embedded model")
    with server(args) as s:
        run(main(s.url))
