"""Multi-turn chat latency on OpenAI-compatible servers (radixserve, llama-server), one at a time.

What resuming a chat from the prefix cache buys a hybrid (recurrent + attention) model,
radixserve beside llama.cpp's llama-server.

The chat: a system prompt of about ``--system-tokens`` (4,000) noise words, then ``--turns``
(10) turns; each appends a user message of about ``--user-tokens`` (50) words and asks for
``--max-tokens`` (32) tokens, greedy, EOS ignored (``ignore_eos``, so every server generates
the same count), streamed from ``/v1/chat/completions``; the answer's exact text goes back into
the history. The words are radixserve.bench.datasets' ``VOCAB`` (about one token each), drawn
from ``--seed``, so every server gets the same prompts. Then ``--single`` fresh prompts (512 and
2,048 words) alone, ``--single-max-tokens`` out. Per request:

* TTFT: request sent → the first chunk with answer text;
* decode tok/s: (output tokens − 1) / (last text chunk − first), output tokens from ``usage``;
* prompt tokens and cached ones: ``usage.prompt_tokens_details.cached_tokens``, else
  llama-server's ``timings.cache_n`` (the tokens it did not process again).

``--model F.gguf`` starts ``radixserve serve`` on it, then (with ``--llama-server``)
llama-server with ``-t``/``-tb`` threads, ``-c --ctx`` and ``--llama-args`` (e.g.
``--no-repack``; ``--ctx-checkpoints 0`` for a llama-server that keeps no recurrent-state
checkpoints), each once the previous one has exited (benchmarks/real_size.py's ``start``;
``--servers`` picks and orders them, ``--tag`` labels a variant), and prints their tables side
by side with each server's ratio to the first one's (hybrid_chat_report.py). ``--base-url``
measures a server already running instead; ``--out`` saves the figures (after each server) and
``--report`` prints saved runs side by side.

The machine must be quiet: llama.cpp's two threads wait for each other at every operation, so
one busy core elsewhere cut its decode several-fold in trials here; each run records the load
average before and after it.

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python benchmarks/hybrid_chat.py \\
        --model /tmp/q35-4b.gguf --llama-args=--no-repack --out /tmp/q35-4b-chat.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_chat_report import report
from real_size import ROOT, cpu_name, start, tree_rss_mb

from radixserve.bench.apis import sse_event
from radixserve.bench.datasets import words

RS, LS = "radixserve", "llama-server"


@dataclass(frozen=True, slots=True)
class ChatSpec:
    """The requests of one run (see the module docstring)."""

    system_tokens: int = 4000
    user_tokens: int = 50
    turns: int = 10
    max_tokens: int = 32
    single: tuple[int, ...] = (512, 2048)
    single_max_tokens: int = 64
    seed: int = 0


DEFAULT = ChatSpec()


@dataclass(slots=True)
class Reply:
    """One streamed answer as the client saw it; times in seconds from the request."""

    text: str = ""
    ttft_s: float | None = None
    last_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def decode_tok_s(self) -> float | None:
        n, first, last = self.output_tokens, self.ttft_s, self.last_s
        if n is None or n < 2 or first is None or last is None or last <= first:
            return None
        return (n - 1) / (last - first)

    def read(self, event: dict, elapsed: float) -> None:
        """Take one SSE event of a chat stream, ``elapsed`` s after the request was sent.
        RuntimeError for an error event."""
        if event.get("error"):
            raise RuntimeError(f"error event: {event['error']}")
        if usage := event.get("usage"):
            self.prompt_tokens = usage.get("prompt_tokens")
            self.output_tokens = usage.get("completion_tokens")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            self.cached_tokens = cached if cached is not None else self.cached_tokens
        timings = event.get("timings") or {}
        if self.cached_tokens is None and "cache_n" in timings:
            self.cached_tokens = timings["cache_n"]
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                self.ttft_s = elapsed if self.ttft_s is None else self.ttft_s
                self.last_s = elapsed
                self.text += text

    def figures(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "text"},
                "decode_tok_s": self.decode_tok_s}


def request_body(model: str | None, messages: list[dict], max_tokens: int) -> dict:
    """A greedy, streamed chat request for exactly ``max_tokens`` tokens (EOS ignored)."""
    body = {"messages": list(messages), "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    return {"model": model, **body} if model else body


def send(client: httpx.Client, base_url: str, body: dict, reply: Reply | None = None) -> Reply:
    """POST ``body`` to the chat route and read its stream into ``reply`` (a new `Reply` by
    default). RuntimeError on an HTTP error."""
    reply = Reply() if reply is None else reply
    start_t = time.perf_counter()
    with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.read().decode()[:300]}")
        for line in resp.iter_lines():
            event = sse_event(line.encode())
            if isinstance(event, dict):
                reply.read(event, time.perf_counter() - start_t)
    return reply


def run_chat(client: httpx.Client, base_url: str, model: str | None,
             spec: ChatSpec) -> list[Reply]:
    """The chat's turns, each answer fed back as the next turn's history."""
    rng = random.Random(spec.seed)
    messages = [{"role": "system", "content": words(rng, spec.system_tokens)}]
    replies = []
    for _ in range(spec.turns):
        messages.append({"role": "user", "content": words(rng, spec.user_tokens)})
        reply = send(client, base_url, request_body(model, messages, spec.max_tokens))
        messages.append({"role": "assistant", "content": reply.text})
        replies.append(reply)
    return replies


def measure(base_url: str, spec: ChatSpec, label: str) -> dict:
    """The chat and the single prompts on the server at ``base_url``: a run's figures."""
    # a fresh connection per request: llama-server closes a streamed response's connection,
    # and reusing it raced with the close ("Server disconnected without sending a response")
    with httpx.Client(timeout=httpx.Timeout(3600.0, connect=30.0),
                      limits=httpx.Limits(max_keepalive_connections=0)) as client:
        models = client.get(f"{base_url}/v1/models").json().get("data") or []
        model = models[0]["id"] if models else None
        turns = run_chat(client, base_url, model, spec)
        single = {}
        for n in spec.single:
            rng = random.Random(spec.seed + 1000 + n)
            body = request_body(model, [{"role": "user", "content": words(rng, n)}],
                                spec.single_max_tokens)
            single[str(n)] = send(client, base_url, body).figures()
    return {"label": label, "model": model, "spec": asdict(spec),
            "turns": [t.figures() for t in turns], "single": single}


def server_runs(args: argparse.Namespace) -> list[tuple[str, list[str], int]]:
    """(label, command, port) of each server of ``--servers`` to start, in that order."""
    t = str(args.threads)
    commands = {
        RS: ([str(ROOT / ".venv/bin/radixserve"), "serve", "--model", args.model, "--port", "8494",
              "--threads", t, "--max-model-len", str(args.ctx),
              *shlex.split(args.radixserve_args)], 8494),
        LS: ([args.llama_server or "llama-server", "-m", args.model, "--host", "127.0.0.1",
              "--port", "8495", "-t", t, "-tb", t, "-c", str(args.ctx),
              *shlex.split(args.llama_args)], 8495)}
    tag = f" ({args.tag})" if args.tag else ""
    return [(label + tag, *commands[label]) for label in args.servers.split(",")]


def run_servers(args: argparse.Namespace, spec: ChatSpec) -> list[dict]:
    """Each server in turn: started, measured, stopped, its figures saved to ``--out`` at once;
    the load average before its start and after its run. A server that fails is reported (its
    log's path) and left out; the others still run."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for label, cmd, port in server_runs(args):
        load, log = os.getloadavg(), work / f"hybrid-chat-{label.split()[0]}.log"
        try:
            proc, ready = start(cmd, port, log)
        except RuntimeError as exc:
            print(f"{label}: {exc}", file=sys.stderr)
            continue
        try:
            run = measure(f"http://127.0.0.1:{port}", spec, label)
            run["rss_mb"] = tree_rss_mb(proc.pid)
        except (RuntimeError, httpx.HTTPError) as exc:
            print(f"{label} failed: {exc!r}; its log: {log}", file=sys.stderr)
            continue
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        run.update(load_before=load, load_after=os.getloadavg(), ready_s=ready,
                   command=shlex.join(cmd))
        results.append(run)
        print(f"{label}: load average {', '.join(f'{x:.2f}' for x in load)} before, "
              f"{', '.join(f'{x:.2f}' for x in run['load_after'])} after; ready in "
              f"{ready:.1f} s; RSS {run['rss_mb']:,.0f} MB\n{report([run])}\n", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        time.sleep(2)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="a GGUF file: start the servers on it")
    where.add_argument("--base-url", help="measure this running server instead")
    where.add_argument("--report", nargs="+", help="print saved runs (--out files)")
    ap.add_argument("--label", default="server", help="the --base-url server's name")
    ap.add_argument("--tag", default="", help="with --model: added to the servers' labels")
    ap.add_argument("--servers", default=None,
                    help=f"with --model, which to start, in order (default: {RS}, then {LS} "
                         "when --llama-server is set)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--llama-args", default="", help="e.g. --llama-args=--no-repack")
    ap.add_argument("--radixserve-args", default="")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=16384, help="context of every server")
    ap.add_argument("--system-tokens", type=int, default=DEFAULT.system_tokens)
    ap.add_argument("--user-tokens", type=int, default=DEFAULT.user_tokens)
    ap.add_argument("--turns", type=int, default=DEFAULT.turns)
    ap.add_argument("--max-tokens", type=int, default=DEFAULT.max_tokens)
    ap.add_argument("--single", default="512,2048", help="single prompts' sizes ('' for none)")
    ap.add_argument("--single-max-tokens", type=int, default=DEFAULT.single_max_tokens)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="save the runs as JSON")
    ap.add_argument("--work", default="/tmp/radixserve-hybrid-chat", help="server logs")
    args = ap.parse_args()
    if args.report:
        runs = [run for path in args.report for run in json.loads(Path(path).read_text())]
        print(report(runs))
        return
    sizes = tuple(int(s) for s in args.single.split(",") if s.strip())
    spec = ChatSpec(args.system_tokens, args.user_tokens, args.turns, args.max_tokens, sizes,
                    args.single_max_tokens, args.seed)
    if min(spec.system_tokens, spec.user_tokens, spec.turns, spec.max_tokens, *sizes, 1) < 1:
        sys.exit("sizes, turns and token counts must be >= 1")
    if args.model:
        args.model = str(Path(args.model).resolve())
        args.servers = args.servers or (f"{RS},{LS}" if args.llama_server else RS)
        unknown = set(args.servers.split(",")) - {RS, LS}
        if unknown:
            sys.exit(f"unknown servers {sorted(unknown)}; known: {RS}, {LS}")
        runs = run_servers(args, spec)
    else:
        runs = [measure(args.base_url.rstrip("/"), spec, args.label)]
    if not runs:
        sys.exit("no server completed its run")
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs, threads {args.threads}")
    print(report(runs))
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
