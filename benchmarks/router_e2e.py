"""Two radixserve workers behind an external router (vllm-router or sglang-router from PyPI):
prefix-cache hit rate and TTFT per routing policy on a multi-turn chat workload, then what
the router does when a worker dies mid-run.

    .venv/bin/python benchmarks/router_e2e.py \
        [--router-bin /work/peers/venvs/routers/bin/vllm-router] \
        [--policies round_robin,cache_aware,kv_aware] [--kill-policy cache_aware]

Each worker is ``radixserve serve --threads 1`` on the embedded model with KV events on
(``tcp://127.0.0.1:<port>``, a replay socket, topic "" (vLLM's default; vllm-router's static sources
read no other), PYTHONHASHSEED=0). For each policy: both caches are
emptied (``POST /reset_prefix_cache``), a fresh router starts (kv_aware is given each
worker's event and replay endpoints), the workload runs (``--conversations`` chats with their
own long system prompt, ``--turns`` user turns each, the answers fed back, ``--concurrency``
chats at a time, streamed, greedy), and the workers' ``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries`` deltas give the hit rate; TTFT is the client's, to the first
content. ``--kill-policy``: the workload again, worker 1 SIGKILLed once a third of the
requests are done; each request's outcome and the router's log lines about it are printed.
Figures are indicative: the machine is shared (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ("lighthouses", "volcanoes", "bread baking", "chess openings", "bees", "railways",
          "glaciers", "violins", "tea", "comets", "coral reefs", "typewriters")
QUESTIONS = ("Give me one surprising fact.", "Why does that happen?",
             "Say it again for a child.", "What should I read next?", "Summarise in a line.",
             "Any common mistake people make?")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout:.0f} s; see {log}")


def start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own session (so a kill reaches its engine process too)."""
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Worker:
    def __init__(self, i: int, logs: Path, block_size: int) -> None:
        self.port, self.events, self.replay = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"enable_kv_cache_events": True, "topic": "",
                  "endpoint": f"tcp://127.0.0.1:{self.events}", "replay_endpoint": f"tcp://127.0.0.1:{self.replay}"}
        self.log = logs / f"worker{i}.log"
        self.proc = start([sys.executable, "-m", "radixserve", "serve", "--port", str(self.port),
                           "--threads", "1", "--served-model-name", "smol", "--block-size",
                           str(block_size), "--kv-events-config", json.dumps(config)],
                          self.log, {"PYTHONHASHSEED": "0"})

    def counters(self) -> dict[str, float]:
        """The vllm: prefix-cache and request counters, summed over the worker's engines."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for name in ("prefix_cache_hits", "prefix_cache_queries", "request_success"):
            values = re.findall(rf"^vllm:{name}_total{{[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE)
            out[name] = sum(map(float, values))
        return out


def router_cmd(args, policy: str, port: int, workers: list[Worker]) -> list[str]:
    urls = [w.url for w in workers]
    if "sglang" in Path(args.router_bin).name:
        return [args.router_bin, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy",
                policy, "--worker-urls", *urls, "--prometheus-port", str(free_port())]
    cmd = [args.router_bin, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
           "--worker-urls", *urls, "--prometheus-port", str(free_port()),
           "--health-check-interval-secs", str(args.health_interval),
           "--log-level", args.router_log_level]
    if policy == "kv_aware":
        for w in workers:
            cmd += ["--kv-event-source", f"{w.url}=tcp://127.0.0.1:{w.events}",
                    "--kv-event-replay-source", f"{w.url}=tcp://127.0.0.1:{w.replay}"]
        cmd += ["--kv-event-block-size", str(args.block_size), "--kv-event-model", "smol"]
    return cmd


def system_prompt(c: int) -> str:
    topic = TOPICS[c % len(TOPICS)]
    return (f"You are guide number {c}, an expert on {topic}. " +
            f"Answer briefly and precisely about {topic}; never change the subject. " * 12)


async def chat_turn(client: httpx.AsyncClient, url: str, messages: list[dict],
                    max_tokens: int) -> tuple[float | None, str, str | None]:
    """(TTFT s, answer text, error) of one streamed greedy chat completion."""
    body = {"model": "smol", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    start_t, ttft, text = time.perf_counter(), None, []
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return None, "", f"HTTP {r.status_code}: {(await r.aread())[:160]!r}"
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return ttft, "".join(text), f"stream error: {chunk['error']}"[:200]
                for choice in chunk.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        ttft = ttft if ttft is not None else time.perf_counter() - start_t
                        text.append(piece)
    except httpx.HTTPError as exc:
        return ttft, "".join(text), f"{type(exc).__name__}: {exc}"[:200]
    return ttft, "".join(text), None


async def workload(url: str, args, on_done=None) -> list[dict]:
    """Every turn of every conversation: {conv, turn, ttft, error, t}."""
    results: list[dict] = []
    gate = asyncio.Semaphore(args.concurrency)
    t0 = time.perf_counter()

    async def conversation(c: int, client: httpx.AsyncClient) -> None:
        async with gate:
            messages = [{"role": "system", "content": system_prompt(c)}]
            for turn in range(args.turns):
                messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
                ttft, answer, error = await chat_turn(client, url, messages, args.max_tokens)
                results.append({"conv": c, "turn": turn, "ttft": ttft, "error": error,
                                "t": round(time.perf_counter() - t0, 2)})
                if on_done is not None:
                    on_done(len(results))
                messages.append({"role": "assistant", "content": answer or "(no answer)"})

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(conversation(c, client) for c in range(args.conversations)))
    return results


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else (values[0] if values else float("nan"))


def run_policy(args, policy: str, workers: list[Worker], logs: Path) -> dict:
    for w in workers:
        r = httpx.post(f"{w.url}/reset_prefix_cache?reset_running_requests=true", timeout=60)
        assert r.status_code == 200, r.text
    before = [w.counters() for w in workers]
    port, log = free_port(), logs / f"router_{policy}.log"
    router = start(router_cmd(args, policy, port, workers), log)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", router, 120, log)
        start_t = time.perf_counter()
        results = asyncio.run(workload(f"http://127.0.0.1:{port}", args))
        wall = time.perf_counter() - start_t
    finally:
        stop(router)
    after = [w.counters() for w in workers]
    hits = sum(a["prefix_cache_hits"] - b["prefix_cache_hits"] for a, b in zip(after, before))
    queries = sum(a["prefix_cache_queries"] - b["prefix_cache_queries"]
                  for a, b in zip(after, before))
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    return {"policy": policy, "requests": len(results),
            "errors": sum(r["error"] is not None for r in results),
            "per_worker": [int(a["request_success"] - b["request_success"])
                           for a, b in zip(after, before)],
            "hit_rate": hits / queries if queries else 0.0, "hit_tokens": int(hits),
            "query_tokens": int(queries), "ttft_p50": percentile(ttfts, 50),
            "ttft_p90": percentile(ttfts, 90), "wall_s": wall}


def kill_test(args, workers: list[Worker], logs: Path) -> dict:
    """The workload under ``--kill-policy``; worker 1 SIGKILLed after a third of it."""
    port, log = free_port(), logs / "router_kill.log"
    router = start(router_cmd(args, args.kill_policy, port, workers), log)
    total = args.conversations * args.turns
    killed_at: list[float] = []
    t0 = time.perf_counter()

    def on_done(n: int) -> None:
        if n >= total // 3 and not killed_at:
            os.killpg(workers[1].proc.pid, signal.SIGKILL)
            killed_at.append(round(time.perf_counter() - t0, 2))

    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", router, 120, log)
        t0 = time.perf_counter()
        results = asyncio.run(workload(f"http://127.0.0.1:{port}", args, on_done))
        time.sleep(args.after_kill_wait)  # the router's health checks may notice meanwhile
        after = asyncio.run(workload(f"http://127.0.0.1:{port}", argparse.Namespace(
            **{**vars(args), "conversations": 4, "turns": 1})))
    finally:
        stop(router)
    return {"policy": args.kill_policy, "killed_at_s": killed_at, "results": results,
            "errors": [r for r in results if r["error"]], "after_kill_errors":
            [r["error"] for r in after if r["error"]], "router_log": log_summary(log)}


def log_summary(log: Path) -> list[str]:
    """The router's warnings, errors and health / circuit-breaker / retry lines, ANSI
    colours and timestamps dropped, each distinct one once with its count."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if re.search(r"WARN|ERROR|(?i:retry|unhealthy|circuit|remov|health)", line):
            key = re.sub(r"^\S+ \S+\s+", "", line)[:240]
            counts[key] = counts.get(key, 0) + 1
    return [f"{n} x {key}" for key, n in counts.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--router-bin", default="/work/peers/venvs/routers/bin/vllm-router")
    p.add_argument("--policies", default="round_robin,cache_aware,kv_aware")
    p.add_argument("--kill-policy", default="cache_aware", help="'' skips the kill test")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--health-interval", type=int, default=5, help="vllm-router's, seconds")
    p.add_argument("--after-kill-wait", type=float, default=20.0,
                   help="seconds between the killed run and 4 more chats")
    p.add_argument("--router-log-level", default="info", help="vllm-router's")
    p.add_argument("--logs", default="/tmp/router_e2e")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} CPUs; router "
          f"{args.router_bin}; {args.conversations} chats x {args.turns} turns, "
          f"concurrency {args.concurrency}, max_tokens {args.max_tokens}", flush=True)
    workers = [Worker(i, logs, args.block_size) for i in range(2)]
    out: dict = {"load_start": os.getloadavg(), "policies": []}
    try:
        for w in workers:
            wait_http(f"{w.url}/health", w.proc, 300, w.log)
        print(f"{'policy':<14}{'hit rate':>9}{'hit/query tokens':>20}{'TTFT p50':>10}"
              f"{'TTFT p90':>10}{'per worker':>12}{'errors':>8}{'wall s':>8}", flush=True)
        for policy in filter(None, args.policies.split(",")):
            r = run_policy(args, policy, workers, logs)
            out["policies"].append(r)
            print(f"{policy:<14}{r['hit_rate']:>9.3f}{r['hit_tokens']:>10}/{r['query_tokens']:<9}"
                  f"{r['ttft_p50']:>10.3f}{r['ttft_p90']:>10.3f}{r['per_worker']!s:>12}"
                  f"{r['errors']:>8}{r['wall_s']:>8.1f}", flush=True)
        if args.kill_policy:
            k = kill_test(args, workers, logs)
            out["kill"] = {key: v for key, v in k.items() if key != "results"}
            ok = sum(r["error"] is None for r in k["results"])
            print(f"\nworker 1 SIGKILLed at {k['killed_at_s']} s under {k['policy']}: "
                  f"{ok}/{len(k['results'])} requests ok; failures:", flush=True)
            for r in k["errors"]:
                print(f"  t={r['t']} s chat {r['conv']} turn {r['turn']}: {r['error']}")
            print(f"afterwards, 4 new chats: errors {k['after_kill_errors']}")
            print(f"router log (worker 1 was {workers[1].url}):", *k["router_log"],
                  sep="\n  ")
    finally:
        for w in workers:
            stop(w.proc)
    out["load_end"] = os.getloadavg()
    print(f"load average at end: {out['load_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
