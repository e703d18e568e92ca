"""benchmarks/agent_trace.py's client and server handling: a streamed chat answer read as an
agent's (`AgentReply`: text, reasoning or tool calls), one request sent (`send`), and a server
started, warmed up, measured and stopped with every process under it (`Server`)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_chat import Reply
from hybrid_chat import send as hybrid_send
from real_size import start


@dataclass(slots=True)
class AgentReply(Reply):
    """A streamed answer whose first token may be text, reasoning or a tool call; an answer
    of nothing (EOS first) takes its finish chunk's time as its TTFT. Tool calls are put
    together from their deltas (index -> name, arguments) to go back into the history."""

    calls: dict = field(default_factory=dict)

    def read(self, event: dict, elapsed: float) -> None:
        Reply.read(self, event, elapsed)
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            for tc in delta.get("tool_calls") or ():
                call = self.calls.setdefault(tc.get("index", len(self.calls)),
                                             {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            if delta.get("tool_calls") or delta.get("reasoning_content") or \
                    choice.get("finish_reason"):
                self.ttft_s = elapsed if self.ttft_s is None else self.ttft_s

    def figures(self) -> dict:
        figures = Reply.figures(self)
        del figures["calls"]
        return {**figures, "is_tool_call": bool(self.calls)}


def send(base_url: str, body: dict) -> AgentReply:
    """POST ``body`` to the chat route and read its stream. RuntimeError on an HTTP error."""
    # a fresh connection per request: llama-server closes a streamed response's connection
    with httpx.Client(timeout=httpx.Timeout(3600.0, connect=30.0)) as client:
        reply = hybrid_send(client, base_url, body, AgentReply())
    if reply.ttft_s is None:
        raise RuntimeError(f"the stream carried no answer: {body['messages'][-1]}")
    return reply


def model_id(base_url: str) -> str | None:
    models = httpx.get(f"{base_url}/v1/models", timeout=30).json().get("data") or []
    return models[0]["id"] if models else None


def stop(proc) -> None:
    """SIGTERM to the server, then wait for it and every process under it (radixserve's engine
    saves its prefix cache's pages to the disk tier before it exits)."""
    try:
        procs = [psutil.Process(proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=180)
    for p in alive:
        p.kill()
    proc.wait(timeout=30)


def warmup_body(tools: list[dict]) -> dict:
    """A one-token request with the trace's first tool and nothing else of it: it takes the
    template's and the parser's tool path and pays what a start leaves to the first request
    (lazy set-up, first calls) for a prompt of a few hundred tokens, and it shares no whole
    KV page with the trace (its system message is the template's default)."""
    return {"messages": [{"role": "user", "content": "Say OK."}], "tools": tools[:1],
            "max_tokens": 1, "temperature": 0.0, "stream": True}


def with_model(body: dict, model: str | None) -> dict:
    return {"model": model, **body} if model else body


class Server:
    """One server's runs: ``serve(cmd)`` starts it, measures, and stops it (log in ``work``).
    With ``warmup`` (a `warmup_body`), that request goes first after every start, its TTFT
    reported apart: what a start leaves for the first request to pay is then kept out of the
    trace's figures."""

    def __init__(self, label: str, work: Path, warmup: dict | None) -> None:
        self.label, self.work, self.warmup, self.num_starts = label, work, warmup, 0

    def serve(self, cmd: list[str], port: int, measure, can_warm: bool = True) -> dict:
        """Start ``cmd``, warm it up (``can_warm``: not under --models-dir, where the first
        request loads the model), call ``measure(base_url)`` (its figures), stop; the figures
        with the start's time to ready and the warm-up's TTFT."""
        self.num_starts += 1
        log = self.work / f"{self.label}-{self.num_starts}.log"
        proc, ready = start(cmd, port, log)
        url, warm = f"http://127.0.0.1:{port}", None
        try:
            if self.warmup and can_warm:
                warm = send(url, with_model(self.warmup, model_id(url))).ttft_s
            figures = measure(url)
        except (RuntimeError, httpx.HTTPError) as exc:
            raise RuntimeError(f"{self.label}: {exc!r}; its log: {log}") from exc
        finally:
            stop(proc)
        return {"ready_s": ready, "warmup_ttft_s": warm, "command": shlex.join(cmd), **figures}
