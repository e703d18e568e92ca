"""``radixserve bench serve``: load-test any OpenAI-compatible server over HTTP.

Streams every request (``stream: true`` with ``stream_options.include_usage``) with aiohttp,
timing each chunk as it arrives (see `radixserve.bench.metrics` for the definitions), from a
dataset of `radixserve.bench.datasets`. Arrivals: all at once (the default), or gamma-distributed
gaps at ``--request-rate`` (Poisson at ``--burstiness`` 1); ``--concurrency`` caps the requests
in flight. A failing request (HTTP error, connection error, an error event in the stream) is
counted as failed, with its message, and the run goes on. The server's prefix-cache counters
are read from ``/metrics`` before and after the run when it exposes them (radixserve, vLLM).

Exit status: 0 when at least one request completed, 1 when none did, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict

from radixserve.bench import datasets as ds
from radixserve.bench.apis import MessagesApi, OllamaApi, OpenAIApi, ResponsesApi
from radixserve.bench.metrics import (
    RequestRecord, cache_counters, format_table, json_safe, parse_prometheus, spec_counters,
    summarize)

DATASETS = ("random", "shared-prefix", "multi-turn", "mixed", "code-edit", "summarise")
APIS = {"openai": OpenAIApi, "responses": ResponsesApi, "ollama": OllamaApi,
        "messages": MessagesApi}
"""--api name -> the request and stream format (`radixserve.bench.apis`)."""
MIXED_RATE, MIXED_BURSTINESS = 4.0, 0.5


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the first of GET /v1/models")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                   help="with --api openai: which OpenAI endpoint; with ollama, "
                        "/api/chat or raw /api/generate")
    p.add_argument("--api", choices=sorted(APIS), default="openai",
                   help="the API the requests speak (the same workload through each route)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--dataset", choices=DATASETS, default="random")
    p.add_argument("--num-prompts", type=int, default=200,
                   help="random, mixed, code-edit, summarise")
    p.add_argument("--input-len", type=int, default=128, help="prompt (or user turn) tokens")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens (not for mixed)")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--request-rate", type=float, default=None,
                   help=f"mean arrivals per second (default: all at once; mixed: {MIXED_RATE})")
    p.add_argument("--burstiness", type=float, default=None,
                   help=f"gamma shape of the arrival gaps: 1 = Poisson (mixed: {MIXED_BURSTINESS})")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM extension)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from-server", action="store_true",
                   help="measure words per token with the server's /tokenize (radixserve, vLLM)")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per request")
    p.add_argument("--num-groups", type=int, default=8, help="shared-prefix: prefixes")
    p.add_argument("--prompts-per-group", type=int, default=8, help="shared-prefix")
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix")
    p.add_argument("--suffix-len", type=int, default=32, help="shared-prefix")
    p.add_argument("--num-conversations", type=int, default=16, help="multi-turn")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: user turns each")
    for kind, share in (("short", 0.3), ("normal", 0.5), ("long", 0.2)):
        p.add_argument(f"--mix-{kind}", type=float, default=share,
                       help=f"mixed: share of {ds.MIXED_OUTPUT_LENS[kind]}-token answers")
    p.add_argument("--label", default=None, help="name of this run in plots (default: URL)")
    p.add_argument("--result-json", default=None, help="write config, summary and records")
    p.add_argument("--plot", default=None, help="write latency CDFs to this PNG")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    mixed = args.dataset == "mixed"
    if args.request_rate is None:
        args.request_rate = MIXED_RATE if mixed else math.inf
    if args.burstiness is None:
        args.burstiness = MIXED_BURSTINESS if mixed else 1.0
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError("--concurrency must be ≥ 1")
    if args.request_timeout <= 0:
        raise ValueError("--request-timeout must be > 0")
    ds.arrival_times(0, args.request_rate, args.burstiness)  # validates both
    ds.from_args(args)  # validates the sizes before any network traffic
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("radixserve: bench serve needs aiohttp: pip install 'radixserve[bench]'",
              file=sys.stderr)
        return 1
    result = asyncio.run(_bench(args))
    print(format_table(result["summary"], f"{args.dataset} @ {args.base_url}"))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(json_safe(result), f, indent=1)
    if args.plot:
        from radixserve.bench.plots import plot_run
        plot_run(result, args.plot)
    return 0 if result["summary"]["completed"] else 1


async def _bench(args: argparse.Namespace) -> dict:
    import aiohttp
    from tqdm import tqdm

    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=args.request_timeout, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=args.concurrency or 0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                     headers=headers) as session:
        model = args.model or await _first_model(session, base)
        words_per_token = 1.0
        if args.tokenizer_from_server:
            words_per_token = await _words_per_token(session, base, model)
        convs = ds.from_args(args, words_per_token)
        arrivals = ds.arrival_times(len(convs), args.request_rate, args.burstiness, args.seed)
        total = sum(len(c.turns) for c in convs)
        sem = (asyncio.Semaphore(args.concurrency) if args.concurrency
               else contextlib.nullcontext())
        records: list[RequestRecord] = []
        bar = tqdm(total=total, desc="bench serve", unit="req", disable=args.no_progress)
        before = await _cache_counters(session, base)
        t0 = time.perf_counter()
        client = _Client(session, base, args, model)
        await asyncio.gather(*(client.conversation(c, t0, at, sem, records, bar)
                               for c, at in zip(convs, arrivals)))
        duration = time.perf_counter() - t0
        bar.close()
        after = await _cache_counters(session, base)
    cache = spec = None
    if before is not None and after is not None:
        cache = _delta(cache_counters(before), cache_counters(after))
        spec = _delta(spec_counters(before), spec_counters(after))
    records.sort(key=lambda r: (r.conversation, r.turn))
    config = {k: v for k, v in vars(args).items() if not callable(v)}
    config.update(model=model, words_per_token=words_per_token, num_requests=total)
    return {"label": args.label or args.base_url, "base_url": args.base_url, "config": config,
            "summary": summarize(records, duration, cache, spec),
            "records": [asdict(r) for r in records]}


class _Client:
    """Sends the turns of conversations as streamed requests and times them."""

    def __init__(self, session, base: str, args: argparse.Namespace, model: str | None) -> None:
        self.session, self.args, self.model = session, args, model
        self.api = APIS[args.api](args)
        self.url = base + self.api.path

    async def conversation(self, conv: ds.Conversation, t0: float, at: float, sem,
                           records: list[RequestRecord], bar) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        history: list[dict] = []
        failed = ""
        for i, turn in enumerate(conv.turns):
            history.append({"role": "user", "content": turn.text})
            if failed:
                rec, answer = RequestRecord(error=f"skipped: turn {i - 1} failed"), ""
            else:
                async with sem:
                    rec, answer = await self.send(self.payload(history, turn.output_len), t0)
                failed = rec.error
            rec.output_len, rec.tag, rec.conversation, rec.turn = (
                turn.output_len, conv.tag, conv.index, i)
            if not rec.usage:
                rec.prompt_tokens = sum(len(m["content"].split()) for m in history)
            history.append({"role": "assistant", "content": answer})
            records.append(rec)
            bar.update(1)

    def payload(self, history: list[dict], max_tokens: int) -> dict:
        body = self.api.payload(history, max_tokens)
        if self.model:
            body["model"] = self.model
        if self.args.ignore_eos:
            body["ignore_eos"] = True
        if self.args.temperature is not None:
            body["temperature"] = self.args.temperature
        return body

    async def send(self, body: dict, t0: float) -> tuple[RequestRecord, str]:
        """One streamed request → (its record, the answer text). Never raises for
        server or network failures: they end up in ``record.error``."""
        import aiohttp

        stream = _Stream(self.api)
        rec = stream.record
        start = time.perf_counter()
        rec.start = start - t0
        try:
            async with self.session.post(self.url, json=self.api.finalize(body)) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {_short(await resp.text())}"
                    rec.e2e = time.perf_counter() - start
                    return rec, ""
                buf = b""
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    *lines, buf = (buf + data).split(b"\n")
                    for line in lines:
                        stream.line(line, start, now)
                    if rec.error or stream.done:
                        break
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        stream.finish(start)
        return rec, "".join(stream.parts)


class _Stream:
    """Parse state of one SSE response; ``api.read`` interprets each event."""

    def __init__(self, api) -> None:
        self.api = api
        self.record = RequestRecord()
        self.parts: list[str] = []
        self.chunks = 0
        self.last: float | None = None
        self.done = False  # [DONE] seen
        self.finished = False  # the end of the answer seen (a finish_reason, ...)

    def line(self, raw: bytes, start: float, now: float) -> None:
        event = self.api.parse(raw)
        if event is None:
            return
        if event == "[DONE]":
            self.done = True
            return
        self.api.read(event, self, start, now)

    def error(self, err) -> None:
        self.record.error = str(err.get("message", err) if isinstance(err, dict) else err)

    def usage(self, prompt: int, output: int, cached: int | None) -> None:
        self.record.usage = True
        self.record.prompt_tokens, self.record.output_tokens = prompt, output
        if cached is not None:
            self.record.cached_tokens = cached

    def text(self, text: str, other: str, start: float, now: float) -> None:
        """A chunk of the answer (``other``: reasoning, not kept in the history)."""
        if not (text or other):
            return
        if self.last is None:
            self.record.ttft = now - start
        else:
            self.record.itl.append(now - self.last)  # several tokens in one chunk: one gap
        self.last = now
        self.chunks += 1
        self.parts.append(text)

    def finish(self, start: float) -> None:
        r = self.record
        r.e2e = time.perf_counter() - start
        if not r.error and not (self.done or self.finished):
            r.error = "the stream ended before [DONE] or a finish_reason"
        r.ok = not r.error
        if not r.usage:
            r.output_tokens = self.chunks


def _probe_errors() -> tuple:
    """What a probe of /v1/models, /tokenize or /metrics may raise on a bad answer."""
    import aiohttp
    return (aiohttp.ClientError, OSError, TimeoutError, ValueError, LookupError, TypeError,
            AttributeError)


def _short_timeout():
    import aiohttp
    return aiohttp.ClientTimeout(total=15)


async def _first_model(session, base: str) -> str | None:
    """The first model the server lists, or None (then no ``model`` field is sent)."""
    try:
        async with session.get(f"{base}/v1/models", timeout=_short_timeout()) as resp:
            data = (await resp.json()).get("data") or []
            return data[0]["id"] if data else None
    except _probe_errors():  # the requests will report it
        return None


async def _words_per_token(session, base: str, model: str | None) -> float:
    """Words of `VOCAB` text per token, measured with ``POST /tokenize``; 1.0 on failure."""
    import random
    sample = ds.words(random.Random(12345), 1000)
    body = {"prompt": sample, "add_special_tokens": False, **({"model": model} if model else {})}
    try:
        async with session.post(f"{base}/tokenize", json=body, timeout=_short_timeout()) as resp:
            count = (await resp.json())["count"]
        return 1000 / count
    except _probe_errors() as exc:
        print(f"radixserve: /tokenize failed ({exc!r}); assuming one token per word",
              file=sys.stderr)
        return 1.0


def _delta(before: tuple | None, after: tuple | None) -> tuple | None:
    if before is None or after is None:
        return None
    return tuple(a - b for a, b in zip(after, before))


async def _cache_counters(session, base: str) -> dict[str, float] | None:
    """The server's parsed /metrics (None when it has none)."""
    try:
        async with session.get(f"{base}/metrics", timeout=_short_timeout()) as resp:
            if resp.status != 200:
                return None
            return parse_prometheus(await resp.text())
    except _probe_errors():
        return None


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "…"
