"""Pathological structured-output specs beside normal traffic: each must be refused quickly
with a clear 4xx (or served), and never stall the other streams.

    .venv/bin/python benchmarks/structured_pathological.py [--streams 8] [--url URL]

Normal streams (unconstrained chat, 64 tokens, one after another per stream) run the whole
time; meanwhile each pathological request is sent in turn. Per request it prints the status,
the time to the answer and the error's first words; then the normal streams' inter-token gaps
(p50 / p99 / max) while the pathological requests were in flight against before them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))


def _deep(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


CASES = {
    "deep nesting (300 objects)": {"json_schema": _deep(300)},
    "100,000-member enum": {"json_schema": {"enum": [f"v{i}" for i in range(100_000)]}},
    "catastrophic regex pattern": {"json_schema": {"type": "string",
                                                   "pattern": "^(a+)+(b+)+(c+)+$"}},
    "regex (a|aa)*b over 64 copies": {"regex": "(" + "(a|aa)*" * 64 + ")b"},
    "anyOf of 2,000 objects": {"json_schema": {"anyOf": [
        {"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]}
        for i in range(2000)]}},
    "recursive $ref without a base case": {"json_schema": {
        "$defs": {"a": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                        "required": ["a"]}}, "$ref": "#/$defs/a"}},
    "self-contradictory (allOf string and integer)": {"json_schema": {
        "allOf": [{"type": "string"}, {"type": "integer"}]}},
    "not a JSON Schema": {"json_schema": {"type": "objectx"}},
}


def body(case: dict) -> dict:
    out = {"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 16,
           "temperature": 0}
    if "json_schema" in case:
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "x", "schema": case["json_schema"]}}
    else:
        out["structured_outputs"] = {"regex": case["regex"]}
    return out


async def stream(client: httpx.AsyncClient, gaps: list[tuple[float, float]], stop: asyncio.Event):
    while not stop.is_set():
        payload = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                   "max_tokens": 64, "temperature": 0, "stream": True}
        last = None
        async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    now = time.monotonic()
                    if last is not None:
                        gaps.append((now, now - last))
                    last = now


def describe(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: none"
    values = sorted(values)
    return (f"{name}: p50 {1000 * statistics.median(values):.1f} ms, "
            f"p99 {1000 * values[int(0.99 * (len(values) - 1))]:.1f} ms, "
            f"max {1000 * values[-1]:.1f} ms ({len(values)} gaps)")


async def main(url: str, num_streams: int) -> None:
    gaps: list[tuple[float, float]] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        streams = [asyncio.create_task(stream(client, gaps, stop)) for _ in range(num_streams)]
        await asyncio.sleep(5)
        start = time.monotonic()
        windows: list[tuple[str, float, float]] = []
        for name, case in CASES.items():
            t0 = time.monotonic()
            r = await client.post("/v1/chat/completions", json=body(case))
            seconds = time.monotonic() - t0
            detail = r.json().get("error", {}).get("message", "")[:90] if r.status_code >= 400 \
                else json.dumps(r.json()["choices"][0]["message"]["content"])[:60]
            windows.append((name, t0, t0 + seconds))
            print(f"{name:46} {r.status_code}  {seconds * 1000:7.0f} ms  {detail}")
        end = time.monotonic()
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*streams)
    print(describe("normal streams' gaps before", [g for t, g in gaps if t < start]))
    print(describe("normal streams' gaps during", [g for t, g in gaps if start <= t <= end]))
    for name, t0, t1 in windows:  # a gap ending within the request's time (or just after)
        print(describe(f"  while {name}", [g for t, g in gaps if t0 <= t <= t1 + 0.05]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.url:
        asyncio.run(main(args.url, args.streams))
    else:
        from server_proc import ServerProc

        server = ServerProc(timeout=600)
        try:
            asyncio.run(main(server.url, args.streams))
        finally:
            server.stop()
