"""How long ``radixserve serve`` takes to be ready (``/health`` answering 200), beside llama.cpp's
``llama-server`` on the same GGUF file, and with ``--profile`` where the time goes.

Each run launches the server, polls ``/health`` every 20 ms from launch until it answers 200
(llama-server answers 503 while it loads), reads the CPU seconds its processes used by then
(all threads: the start-up's work, which other load on the machine changes less than the
wall time), times one /v1/completions sent at once (one token: work a server left for after
ready shows there), then stops it (SIGINT) and waits for it;
the servers take turns (radixserve, llama-server, radixserve, ...) so a burst of load from
elsewhere falls on both. Prints each run, the medians, the CPU and the load average before
and after (other work on the machine slows start-up: repeat when it is low).

``--profile`` runs radixserve twice more with ``RADIXSERVE_STARTUP_PROFILE`` set
(radixserve/startup_trace.py: each process's marks and spans on one wall clock): once with the
marks alone, whose timeline of both processes from launch is the phases at full speed, then
with each main thread (and each profiled span's thread) under cProfile, whose heaviest
radixserve functions (cumulative) and slowest imports it prints. cProfile slows Python code
down (about 1.3x on import-heavy start-up): these runs' ready times are not in the medians.

    .venv/bin/python benchmarks/startup_profile.py --model /work/models/coder15.gguf \\
        --llama-server /path/to/llama-server --llama-args="--no-repack -t 2" --profile

``LD_LIBRARY_PATH`` defaults to llama-server's own folder (the pip build's libraries lie
beside it). Without ``--llama-server`` (or ``LLAMA_SERVER``) only radixserve runs.
``--baseline DIR`` adds another version of radixserve in turn (DIR holds its ``radixserve/``
package, e.g. ``git archive`` of a commit with the built ``kernels/*.so`` copied in), put
first on ``PYTHONPATH``; its processes are spawned with the same path.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ENV = "RADIXSERVE_STARTUP_PROFILE"  # radixserve/startup_trace.py
MARKS_ONLY = "RADIXSERVE_STARTUP_PROFILE_MARKS_ONLY"
POLL_S = 0.02


def wait_ready(proc: subprocess.Popen, port: int, t0: float, timeout: float) -> float:
    """Seconds from ``t0`` to the first 200 on /health; RuntimeError if the process exits or
    the time runs out."""
    url = f"http://127.0.0.1:{port}/health"
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return time.time() - t0
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"not ready in {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` and its live descendants (all
    their threads): the start-up's work, less sensitive to other load than its wall time."""
    tick, total, todo = os.sysconf("SC_CLK_TCK"), 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def first_request(port: int) -> float:
    """Seconds one /v1/completions (a short prompt, one token, greedy) takes, sent the moment
    the server is ready: work left for after ready shows here."""
    body = json.dumps({"prompt": "def fibonacci(n):", "max_tokens": 1, "temperature": 0})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body.encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
    return time.time() - t0


@dataclass
class Run:
    launched: float  # time.time() at launch
    ready: float  # seconds from launch to a 200 on /health
    cpu: float  # CPU seconds the server's processes used by then
    first: float  # seconds the first request took


def run_once(cmd: list[str], port: int, env: dict, log: Path, timeout: float,
             profile: Path | None = None) -> Run:
    """One start of ``cmd``; with ``profile`` (its folder), the server is stopped only once
    its records are written."""
    with log.open("w") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            ready = wait_ready(proc, port, t0, timeout)
            cpu = tree_cpu_seconds(proc.pid)
            first = first_request(port)
            if profile is not None:
                _wait_for_files(profile)
            return Run(t0, ready, cpu, first)
        finally:
            stop(proc)


def radixserve_cmd(model: str, port: int, extra: list[str]) -> list[str]:
    script = Path(sys.executable).with_name("radixserve")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "radixserve"]
    return [*head, "serve", "--model", model, "--port", str(port), *extra]


def llama_env(binary: str) -> dict:
    env = dict(os.environ)
    env.setdefault("LD_LIBRARY_PATH", str(Path(binary).resolve().parent))
    return env


# -- the profile ---------------------------------------------------------------------------

def timeline(folder: Path, t0: float) -> list[str]:
    """Both processes' marks and spans, in seconds from launch ``t0``."""
    rows: list[tuple[float, str]] = []
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        role = rec["role"]
        if rec.get("created") is not None:
            rows.append((rec["created"] - t0, f"{role}: process created"))
        rows += [(t - t0, f"{role}: {name}") for name, t in rec["marks"]]
        for name, thread, start, end in rec["spans"]:
            what = f"{role} [{thread}]: {name} ... {end - start:.3f} s, done at {end - t0:.3f}"
            rows.append((start - t0, what))
    return [f"  {t:7.3f}  {what}" for t, what in sorted(rows)]


def heaviest(prof: Path, limit: int) -> list[str]:
    """The profile's radixserve functions by cumulative time, then its slowest top-level
    imports (modules whose import is not inside another listed one), ``limit`` each."""
    stats = pstats.Stats(str(prof)).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    own = sorted(((ct, f"radixserve/{f.rpartition('/radixserve/')[2]}:{line}({fn})")
                  for (f, line, fn), (_, _, _, ct, _) in stats.items()
                  if "/radixserve/" in f and "-packages/" not in f), reverse=True)[:limit]
    mods = sorted(((ct, _module_name(f)) for (f, _, fn), (_, _, _, ct, _) in stats.items()
                   if fn == "<module>" and f.endswith(".py")), reverse=True)
    top, seen = [], []
    for ct, name in mods:
        if not any(name.startswith(s + ".") for s in seen):
            top.append((ct, f"import {name}"))
        seen.append(name)
    lines = [f"    {ct:6.3f} s  {what}" for ct, what in own]
    lines.append("    -- slowest imports (cumulative, nested ones folded in) --")
    lines += [f"    {ct:6.3f} s  {what}" for ct, what in top[:limit]]
    return lines


def _module_name(path: str) -> str:
    """The dotted name of the module in ``path``: its folders up while they are packages."""
    p = Path(path)
    parts = [] if p.name == "__init__.py" else [p.stem]
    while (p.parent / "__init__.py").exists():
        p = p.parent
        parts.insert(0, p.name)
    return ".".join(parts)


def profile_report(folder: Path, t0: float, limit: int) -> list[str]:
    lines = ["timeline (s from launch):", *timeline(folder, t0)]
    for prof in sorted(folder.glob("*.prof")):
        lines += [f"{prof.stem} (cProfile, cumulative):", *heaviest(prof, limit)]
    return lines


def profiled_runs(cmd: list[str], port: int, env: dict, work: Path, timeout: float,
                  limit: int) -> None:
    """Two more runs: the marks alone (the phases at full speed), then under cProfile."""
    for mode, extra in (("marks only", {MARKS_ONLY: "1"}), ("cProfile", {})):
        folder = work / f"profile-{mode.split()[0].lower()}"
        run_env = dict(env, **{ENV: str(folder)}, **extra)
        run = run_once(cmd, port, run_env, work / f"{folder.name}.log", timeout, folder)
        print(f"\nprofiled run ({mode}): ready in {run.ready:.3f} s ({run.cpu:.2f} CPU s), "
              f"first request {run.first:.3f} s; files in {folder}")
        print("\n".join(profile_report(folder, run.launched, limit) if not extra else
                        ["timeline (s from launch):", *timeline(folder, run.launched)]))


def _wait_for_files(folder: Path, timeout: float = 10.0) -> None:
    """Wait for both processes' records, and a moment more: work started in the background
    may end after ready (each span that ends rewrites its process's record)."""
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(folder.glob("*.json"))) < 2:
        time.sleep(0.1)
    time.sleep(1.0)


# -- main ----------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--port", type=int, default=8611)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--serve-args", default="", help="more radixserve serve flags (one string)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--llama-args", default="", help="llama-server's flags (one string)")
    ap.add_argument("--llama-port", type=int, default=8499)
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="also time the radixserve package in DIR (a folder holding a "
                         "radixserve/ of another version, put first on PYTHONPATH), in turn")
    ap.add_argument("--profile", action="store_true",
                    help="two more runs of radixserve (and of --baseline): the phases of "
                         "both processes on one clock, then under cProfile")
    ap.add_argument("--top", type=int, default=12, help="rows per profile")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="startup-profile-"))
    (work / "radixserve").mkdir()
    (work / "baseline").mkdir()
    ours = radixserve_cmd(args.model, args.port, shlex.split(args.serve_args))
    servers = [("radixserve", ours, args.port, dict(os.environ, HF_HUB_OFFLINE="1"))]
    if args.baseline:  # another checkout's radixserve package first on the path
        env = dict(servers[0][3], PYTHONPATH=os.pathsep.join(
            [args.baseline, *filter(None, [os.environ.get("PYTHONPATH")])]))
        servers.append(("baseline", ours, args.port, env))
    if args.llama_server:
        cmd = [args.llama_server, "-m", args.model, "--port", str(args.llama_port),
               *shlex.split(args.llama_args)]
        servers.append(("llama-server", cmd, args.llama_port, llama_env(args.llama_server)))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical; load average before: "
          f"{os.getloadavg()}")
    runs: dict[str, list[Run]] = {name: [] for name, *_ in servers}
    for i in range(args.runs):
        for name, cmd, port, env in servers:
            load = os.getloadavg()[0]
            run = run_once(cmd, port, env, work / f"{name}-{i}.log", args.timeout)
            runs[name].append(run)
            print(f"  run {i + 1} {name:12s} ready in {run.ready:.3f} s ({run.cpu:.2f} CPU s), "
                  f"first request {run.first:.3f} s (load before {load:.2f})", flush=True)
    for name, rs in runs.items():
        ready = [r.ready for r in rs]
        print(f"{name:12s} ready: median {statistics.median(ready):.3f} s over {len(ready)} "
              f"(min {min(ready):.3f}, max {max(ready):.3f}), "
              f"{statistics.median(r.cpu for r in rs):.2f} CPU s; first request: median "
              f"{statistics.median(r.first for r in rs):.3f} s")
    if args.profile:
        for name, _, _, env in servers[:2 if args.baseline else 1]:
            print(f"\n== {name} ==")
            profiled_runs(ours, args.port, env, work / name, args.timeout, args.top)
    print(f"load average after: {os.getloadavg()}; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
