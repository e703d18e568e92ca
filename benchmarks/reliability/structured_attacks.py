"""Structured output that breaks mid-generation (issue 62 item 1): does it fail alone?

``(a{1,N}){1,1000}`` compiles and passes the up-front check (a 200 is expected), then runs
llguidance's lexer out of room ("too many expressions constructed") some tens of tokens into
its output. It once failed every request of the engine step (4 unrelated streams died: the
draft rows' guard itself raised), and a repeat of the regex came back ``finish_reason: "stop"``
with ``''``, which the regex does not match. Each attack sends a poisoned request beside
unconstrained streams and prints how each was answered, then a verdict: "holds" when every
stream completed, the poisoned request failed with an error (a 500 or an error event, as
vLLM's FINISHED_ERROR; a 400 once the spec is known to fail) and no "stop" broke its regex.
The mock engine applies no grammar, so this runs on the embedded model.

    .venv/bin/python benchmarks/reliability/structured_attacks.py [--streams 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import httpx
from common import add_server_args, cpu_name, run, server

PROMPT = "Write the letter a many times: " + "aaaa " * 40


def poisoned(n: int, stream: bool) -> dict:
    """A completion under ``(a{1,n}){1,1000}``; min_tokens keeps the model writing (eos is
    banned) until the matcher breaks."""
    return {"prompt": PROMPT, "max_tokens": 400, "min_tokens": 300, "temperature": 0,
            "stream": stream, "structured_outputs": {"regex": f"(a{{1,{n}}}){{1,1000}}"}}


async def stream_events(client: httpx.AsyncClient, body: dict) -> dict:
    """{status, text, finish_reason, error} of a streamed completion."""
    out = {"status": None, "text": "", "finish_reason": None, "error": None}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            out["error"] = json.loads(await r.aread())["error"]["message"]
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out["error"] = event["error"]["message"]
                continue
            choice = event["choices"][0]
            out["text"] += choice.get("text") or ""
            out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
    return out


async def whole(client: httpx.AsyncClient, body: dict) -> dict:
    r = await client.post("/v1/completions", json=body)
    if r.status_code != 200:
        return {"status": r.status_code, "text": "", "finish_reason": None,
                "error": r.json()["error"]["message"]}
    choice = r.json()["choices"][0]
    return {"status": 200, "text": choice["text"], "finish_reason": choice["finish_reason"],
            "error": None}


def breaks_regex(result: dict, regex: str) -> bool:
    return result["finish_reason"] == "stop" and not re.fullmatch(regex, result["text"])


async def attack(client, name: str, body: dict, num_streams: int, first: bool) -> bool:
    free = {"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 60, "temperature": 0,
            "ignore_eos": True, "stream": True}
    send = stream_events if body["stream"] else whole
    results = await asyncio.gather(send(client, body),
                                   *(stream_events(client, free) for _ in range(num_streams)))
    bad, streams = results[0], results[1:]
    regex = body["structured_outputs"]["regex"]
    streams_ok = all(s["status"] == 200 and s["error"] is None and s["finish_reason"] == "length"
                     for s in streams)
    # the first request that trips the limit fails mid-output (500 / error event); a repeat
    # is refused before its first token (400, or a stream's only event an error); a "stop"
    # must match the regex
    failed = bad["error"] is not None and (bad["status"] in (200, 500) if first
                                           else bad["status"] in (200, 400) and not bad["text"])
    holds = streams_ok and failed and not breaks_regex(bad, regex)
    print(f"{name}: poisoned -> HTTP {bad['status']}, finish {bad['finish_reason']}, "
          f"{len(bad['text'])} chars, error {str(bad['error'])[:110]!r}\n"
          f"    {sum(s['finish_reason'] == 'length' for s in streams)}/{num_streams} "
          f"streams completed; {'holds' if holds else 'BREAKS'}")
    return holds


async def main(url: str, num_streams: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=num_streams + 4)) as client:
        verdicts = [
            await attack(client, "regex (a{1,100}){1,1000}, streamed, beside streams",
                         poisoned(100, True), num_streams, first=True),
            await attack(client, "the same regex again, streamed",
                         poisoned(100, True), num_streams, first=False),
            await attack(client, "regex (a{1,50}){1,1000}, not streamed, beside streams",
                         poisoned(50, False), num_streams, first=True),
            await attack(client, "the same regex again, not streamed",
                         poisoned(50, False), num_streams, first=False),
        ]
    print(f"{sum(verdicts)}/{len(verdicts)} attacks hold")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_server_args(p)
    p.add_argument("--streams", type=int, default=4, help="unconstrained streams beside it")
    args = p.parse_args()
    args.real = True  # the mock engine applies no grammar
    print(f"CPU: {cpu_name()}; engine: embedded model")
    with server(args) as s:
        run(main(s.url, args.streams))
