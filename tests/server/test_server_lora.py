"""LoRA adapters over HTTP on a real server (a tiny random Llama): ``--lora NAME=PATH`` at
start, vLLM's ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` at run time, routing by
model ``NAME``, ``BASE:NAME`` or a ``lora`` field, ``/v1/models`` listing adapters with their
parent, 404s naming what is available; the answers equal the offline engine's. Malformed
adapters are 400s naming the problem while the engine serves on (and a clear CLI error as
``--lora``); adapters loaded at run time are served again by a restarted engine (issue 62),
and are read from ``--lora-adapters-dir`` only."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
from malformed_lora import malformed_adapters
from server_proc import ServerProc, free_port
from test_server_faults import _Stream
from tiny_lora import make_peft_adapter
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams

PROMPT = [5, 17, 33, 101, 7, 250, 9, 64, 12, 40, 41]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    base = make_hf_model("llama", root / "base", seed=3)
    a = make_peft_adapter(base, root / "a", seed=1)
    b = make_peft_adapter(base, root / "b", seed=2, r=4, targets=("q_proj", "v_proj"))
    server = ServerProc("--model", str(base), "--served-model-name", "tiny", "--threads", "1",
                        "--num-kv-blocks", "64", "--lora", f"a={a}",
                        "--enable-lora-runtime-updates", "--lora-adapters-dir", str(root),
                        timeout=240)
    yield server, base, a, b
    server.stop()


def _complete(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **body})


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_routing_models_and_runtime_load(setup):
    server, base, a, b = setup
    offline = LLM(str(base), num_kv_blocks=64, show_progress=False,
                  lora_modules={"a": str(a), "b": str(b)})
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = {name: offline.generate([PROMPT], greedy, lora=name)[0].outputs[0].text
            for name in ("a", "b", None)}
    assert len(set(want.values())) == 3

    assert _text(_complete(server, model="tiny")) == want[None]
    assert _text(_complete(server, model="a")) == want["a"]
    assert _text(_complete(server, model="tiny:a")) == want["a"]
    assert _text(_complete(server, model="tiny", lora="a")) == want["a"]
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny:a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 200, chat.text

    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [(m["id"], m.get("parent"), m.get("root")) for m in models] == [
        ("tiny", None, None), ("a", "tiny", str(a))]

    missing = _complete(server, model="b")
    assert missing.status_code == 404 and "Available: tiny, a" in missing.text

    load = f"{server.url}/v1/load_lora_adapter"
    unload = f"{server.url}/v1/unload_lora_adapter"
    r = httpx.post(load, json={"lora_name": "b", "lora_path": "b"}, timeout=60)  # relative
    assert r.status_code == 200 and "added successfully" in r.text, r.text
    assert _text(_complete(server, model="tiny:b")) == want["b"]
    assert httpx.post(load, json={"lora_name": "b", "lora_path": str(b)}).status_code == 400
    r = httpx.post(load, json={"lora_name": "c", "lora_path": str(b) + "-missing"})
    assert r.status_code == 404, r.text
    wrong = make_peft_adapter(make_hf_model("llama", a.parent / "other", seed=4,
                                            hidden_size=48, intermediate_size=96),
                              a.parent / "wrong", seed=1)
    r = httpx.post(load, json={"lora_name": "w", "lora_path": str(wrong)})
    assert r.status_code == 400 and "do not fit the base model" in r.text
    outside = shutil.copytree(b, a.parent.parent / f"{a.parent.name}-outside")
    r = httpx.post(load, json={"lora_name": "o", "lora_path": str(outside)})
    assert r.status_code == 400 and "--lora-adapters-dir" in r.text, r.text  # a good one

    r = httpx.post(unload, json={"lora_name": "b"})
    assert r.status_code == 200 and "removed successfully" in r.text
    assert _complete(server, model="b").status_code == 404
    assert httpx.post(unload, json={"lora_name": "b"}).status_code == 404
    assert _text(_complete(server, model="a")) == want["a"]  # the other one stays


@pytest.fixture(scope="module")
def malformed(setup):
    _, _, a, _ = setup
    return malformed_adapters(a, a.parent / "malformed")  # in the server's adapters folder


def _load(server, name: str, path) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=60,
                      json={"lora_name": name, "lora_path": str(path)})


def _listed(server) -> list[str]:
    return [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]


def test_malformed_adapters_are_400s_and_the_engine_serves_on(setup, malformed):
    server = setup[0]
    engine, listed = server.engine_pid(), _listed(server)
    stream = _Stream(server.url, {"prompt": PROMPT, "max_tokens": 200, "stream": True,
                                  "ignore_eos": True})
    stream.start()
    assert stream.first.wait(60) and stream.error is None, stream.error
    for name, (path, fragment) in malformed.items():
        r = _load(server, name, path)
        assert r.status_code == 400, (name, r.text)
        error = r.json()["error"]
        assert fragment in error["message"] and error["param"] == "lora_path", (name, error)
    stream.join(120)
    assert stream.status == 200 and stream.done and "error" not in "".join(stream.payloads)
    assert server.engine_pid() == engine and _listed(server) == listed


def test_a_malformed_lora_flag_is_a_clear_cli_error(setup, malformed):
    _, base, _, _ = setup
    for case in ("r_zero", "random_safetensors"):
        path, fragment = malformed[case]
        r = subprocess.run([sys.executable, "-m", "radixserve", "serve", "--model", str(base),
                            "--port", str(free_port()), "--lora", f"z={path}"],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 1, r.stderr
        assert f"radixserve: error: --lora z={path}: " in r.stderr and fragment in r.stderr
        assert "engine" not in r.stderr  # refused before any engine started


def test_a_restarted_engine_serves_the_adapters_loaded_at_run_time(setup):
    """Last in this module: it kills the engine."""
    server, _, a, b = setup
    gone = shutil.copytree(b, a.parent / "gone")
    assert _load(server, "b", b).status_code == 200
    assert _load(server, "gone", gone).status_code == 200
    want_a, want_b = _text(_complete(server, model="a")), _text(_complete(server, model="b"))
    r = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "a"})
    assert r.status_code == 200  # a --lora adapter: the new engine must not bring it back
    shutil.rmtree(gone)  # a new engine cannot load this one again

    dead = server.engine_pid()
    os.kill(dead, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while (httpx.get(f"{server.url}/health").status_code != 200
           or server.engine_pid() in (dead, None) or "gone" in _listed(server)):
        assert time.monotonic() < deadline, "no new engine serving b without gone"
        time.sleep(0.1)
    assert _listed(server) == ["tiny", "b"]
    assert _text(_complete(server, model="b")) == want_b
    assert _complete(server, model="gone").status_code == 404
    assert _load(server, "gone", b).status_code == 200  # the name is free again
    assert _complete(server, model="a").status_code == 404
    assert _load(server, "a", a).status_code == 200, "the new engine kept the unloaded a"
    assert _text(_complete(server, model="a")) == want_a

