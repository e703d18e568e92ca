"""``--models-dir`` under issue 62 item 3's attacks, against a server this starts on a folder
holding one model under two names (the embedded SmolLM2, or ``--model-file``: e.g. Gemma 3 270M,
whose 262k vocabulary makes a leak obvious).

    .venv/bin/python benchmarks/reliability/models_dir_attacks.py [--swaps 20] [--real]
        [--model-file PATH]

- swaps: load-unload cycles of the two names, one loaded at a time; holds when the API
  process's open files and temp folders are back to their level after the first two swaps,
  and its RSS grew less than 100 MB;
- unload under a stream (OpenAI and Ollama): holds when the stream ends its API's way (an
  error event then [DONE]; a last {"error"} line) and the model is unloaded, within seconds;
- fairness: two clients keep one model busy at every instant while the other is requested;
  holds when that load is served well within --startup-timeout;
- keep_alive nan, "999999999999h", 1e308, "inf": holds when each is a 400 and /api/ps still
  answers 200. Exits 1 when any attack broke.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import tempfile
import time

import httpx
from common import add_server_args, report_attacks, rss_mb
from server_proc import ServerProc

from radixserve.models.default import default_model_path

HI = [{"role": "user", "content": "hi"}]


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def folders(root: str) -> int:
    return sum(len(subs) for _, subs, _ in os.walk(root))


def complete(s: ServerProc, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{s.url}/v1/completions", timeout=300,
                      json={"model": model, "prompt": "hi", "max_tokens": 2, **extra})


def swaps(s: ServerProc, tmp: str, num_swaps: int) -> tuple[str, bool]:
    pid = s.proc.pid
    for i in range(2):
        complete(s, "ab"[i % 2])
    fds, dirs, rss = open_files(pid), folders(tmp), rss_mb(pid)
    began = time.monotonic()
    for i in range(2, 2 + num_swaps):
        assert complete(s, "ab"[i % 2]).status_code == 200
    time.sleep(1)  # the last connections close
    d_fds, d_dirs, d_rss = open_files(pid) - fds, folders(tmp) - dirs, rss_mb(pid) - rss
    what = (f"{num_swaps} swaps in {time.monotonic() - began:.0f} s: open files {d_fds:+d}, "
            f"temp folders {d_dirs:+d}, RSS {d_rss:+.0f} MB")
    return what, d_fds <= 0 and d_dirs <= 0 and d_rss < 100


def _stream(url: str, path: str, body: dict, first: concurrent.futures.Future) -> list[str]:
    lines = []
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                first.done() or first.set_result(None)
    return lines


def unload_under_stream(s: ServerProc, api: str) -> tuple[str, bool]:
    path, body = (("/v1/chat/completions", {"model": "a", "stream": True, "messages": HI,
                                            "max_tokens": 4000}) if api == "openai" else
                  ("/api/generate", {"model": "a", "prompt": "hi",
                                     "options": {"num_predict": 4000}}))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = concurrent.futures.Future()
        stream = pool.submit(_stream, s.url, path, body, first)
        first.result(timeout=300)
        began = time.monotonic()
        httpx.post(f"{s.url}/models/unload", json={"model": "a"}, timeout=120)
        try:
            lines = stream.result(timeout=30)
        except concurrent.futures.TimeoutError:
            return "the stream was still open 30 s after the unload", False
        took = time.monotonic() - began
    last = lines[-2][6:] if api == "openai" and lines[-1] == "data: [DONE]" else lines[-1]
    ended = "error" in json.loads(last) if last.startswith("{") else False
    state = httpx.get(f"{s.url}/v1/models/a").json()["status"]["value"]
    return f"ended in {took:.1f} s with {last[:60]!r}; model {state}", ended and \
        state == "unloaded"


def fairness(s: ServerProc, timeout: float) -> tuple[str, bool]:
    complete(s, "a")
    stop = time.monotonic() + timeout

    def client(offset: float) -> None:
        time.sleep(offset)
        while time.monotonic() < stop:
            complete(s, "a", max_tokens=8)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(client, i * 0.05) for i in range(2)]
        time.sleep(1)
        began = time.monotonic()
        code = complete(s, "b").status_code
        waited = time.monotonic() - began
        concurrent.futures.wait(busy)
    return f"b answered {code} after {waited:.1f} s (a busy throughout)", code == 200 and \
        waited < timeout / 2


def keep_alive(s: ServerProc) -> tuple[str, bool]:
    codes = [httpx.post(f"{s.url}/api/generate", timeout=60, content=body).status_code
             for body in (b'{"model": "a", "keep_alive": "nan"}',
                          b'{"model": "a", "keep_alive": "999999999999h"}',
                          b'{"model": "a", "keep_alive": 1e308}',
                          b'{"model": "a", "keep_alive": "inf"}')]
    ps = httpx.get(f"{s.url}/api/ps", timeout=60).status_code
    return f"answers {codes}, then /api/ps {ps}", codes == [400] * 4 and ps == 200


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(parser)
    parser.add_argument("--model-file", default=None, help="a GGUF (default: the embedded one)")
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--startup-timeout", type=float, default=30)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="models-dir-attacks-")
    models, tmp = os.path.join(root, "models"), os.path.join(root, "tmp")
    os.makedirs(models), os.makedirs(tmp)
    for name in ("a", "b"):
        os.symlink(args.model_file or default_model_path(), os.path.join(models, f"{name}.gguf"))
    flags = [] if args.real else ["--mock-engine", "--mock-step-ms", args.mock_step_ms]
    rows = []
    try:
        s = ServerProc("--models-dir", models, "--max-loaded-models", "1", "--drain-timeout",
                       "2", "--startup-timeout", str(args.startup_timeout), *flags,
                       *args.server_arg, timeout=600, env={"TMPDIR": tmp})
        try:
            rows.append(("swaps", *swaps(s, tmp, args.swaps)))
            for api in ("openai", "ollama"):
                rows.append((f"unload under {api} stream", *unload_under_stream(s, api)))
            rows.append(("fairness", *fairness(s, args.startup_timeout)))
            rows.append(("keep_alive", *keep_alive(s)))
        finally:
            s.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report_attacks("--models-dir attacks", args, rows)


if __name__ == "__main__":
    raise SystemExit(main())
