"""Malformed LoRA adapters against a live server (issue 62 item 2), and an engine restart under
adapters loaded at run time.

    .venv/bin/python benchmarks/reliability/lora_attacks.py [--real] [--model PATH]

Each attack POSTs /v1/load_lora_adapter with one malformed adapter (tests/malformed_lora.py:
random and truncated safetensors or GGUF, a config without ``r``, ``r: 0``, a list config, a
0-d tensor, a tensor name without a layer index, ...) built for the served model's shape, while
a stream is in flight. It holds when the answer is a 400 naming the problem, the engine process
is the same one afterwards, and the stream finished. With ``--real`` (the mock serves no
adapters) a good adapter is then loaded, the engine killed, and the attack holds when the new
engine serves the adapter that ``/v1/models`` still lists. Exits 1 when any attack broke.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import add_server_args, engine_pid, report_attacks, server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from malformed_lora import malformed_adapters, write_peft_adapter  # noqa: E402

from radixserve.models.lora_check import lora_base_config  # noqa: E402
from radixserve.models.registry import GGUF_ARCHITECTURES  # noqa: E402
from radixserve.models.source import ModelSource  # noqa: E402


def _good_adapter(model_path: str, out: Path) -> Path:
    cfg = lora_base_config(model_path)
    return write_peft_adapter(out, cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.num_layers)


def _stream(url: str, result: dict) -> None:
    """A long streamed completion; ``result["ok"]`` once it ended with [DONE] and no error."""
    body = {"prompt": "Once upon a time", "max_tokens": 64, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    result["ok"] = (r.status_code == 200 and lines[-1:] == ["data: [DONE]"]
                    and not any('"error"' in line for line in lines))


def _load(url: str, name: str, path) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_lora_adapter", timeout=120,
                      json={"lora_name": name, "lora_path": str(path)})


def malformed_round(s, cases: dict) -> list[tuple[str, str, bool]]:
    """(attack, what happened, held) per malformed adapter."""
    rows = []
    for name, (path, fragment) in cases.items():
        pid, result = engine_pid(s), {}
        stream = threading.Thread(target=_stream, args=(s.url, result))
        stream.start()
        r = _load(s.url, name, path)
        stream.join(180)
        message = r.json().get("error", {}).get("message", r.text) if r.text else ""
        held = (r.status_code == 400 and fragment in message and result.get("ok", False)
                and engine_pid(s) == pid)
        rows.append((name, f"{r.status_code} {message[:90]}", held))
    return rows


def restart_round(s, good: Path) -> tuple[str, str, bool]:
    """Load ``good`` at run time, kill the engine: is it listed and served by the new one?"""
    if _load(s.url, "attack-good", good).status_code != 200:
        return ("restart keeps run-time adapters", "the good adapter did not load", False)
    dead = engine_pid(s)
    os.kill(dead, signal.SIGKILL)
    deadline = time.monotonic() + 300
    while httpx.get(f"{s.url}/health").status_code != 200 or s.engine_pid() in (dead, None):
        if time.monotonic() > deadline:
            return ("restart keeps run-time adapters", "no new engine in 300 s", False)
        time.sleep(0.2)
    listed = "attack-good" in [m["id"] for m in httpx.get(f"{s.url}/v1/models").json()["data"]]
    r = httpx.post(f"{s.url}/v1/completions", timeout=120, json={
        "model": "attack-good", "prompt": "Hello", "max_tokens": 4})
    return ("restart keeps run-time adapters", f"listed {listed}, completion {r.status_code}",
            listed and r.status_code == 200)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_args(parser)
    parser.add_argument("--model", help="the served model (default: the embedded one)")
    args = parser.parse_args()
    model_path = ModelSource.resolve(args.model).path
    root = Path(tempfile.mkdtemp(prefix="lora-attacks-"))
    try:
        good = _good_adapter(model_path, root / "good")
        arch = lora_base_config(model_path).architecture
        gguf_arch = next(k for k, v in GGUF_ARCHITECTURES.items() if v == arch)
        cases = malformed_adapters(good, root / "bad", gguf_arch)
        extra = ("--model", args.model) if args.model else ()
        extra += ("--enable-lora-runtime-updates", "--lora-adapters-dir", str(root))
        with server(args, *extra) as s:
            rows = malformed_round(s, cases)
            if args.real:
                rows.append(restart_round(s, good))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report_attacks("LoRA attacks", args, rows)


if __name__ == "__main__":
    sys.exit(main())
