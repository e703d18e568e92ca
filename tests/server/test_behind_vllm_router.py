"""Two ``radixserve serve --mock-engine`` workers behind vllm-router (PyPI ``vllm-router``, its
cache_aware policy) on loopback: the router finds them healthy, lists the model, streams a chat
request through, and a workload sharing one long system prompt lands on one worker; the
endpoints a router asks a worker for (/get_model_info, /get_server_info, /get_load,
/health_generate) answer; the router routes on the token ids our render endpoints give it
(its debug log: a prefix decision for each request, never "preparation unavailable", its
fallback to text). Skipped, saying so, where the router package is not installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from server_proc import ServerProc, free_port, wait_until_serving

pytest.importorskip("vllm_router", reason="vllm-router is not installed "
                    "(pip install vllm-router; it is in the test extra)")

SYSTEM = "You answer questions about the shared handbook. " + "Handbook text. " * 120


@pytest.fixture(scope="module")
def workers():
    ws = [ServerProc("--mock-engine", "--served-model-name", "tiny", timeout=120)
          for _ in range(2)]
    yield ws
    for w in ws:
        assert w.stop() == 0


@pytest.fixture(scope="module")
def router_log(tmp_path_factory):
    return tmp_path_factory.mktemp("router") / "router.log"


@pytest.fixture(scope="module")
def router(workers, router_log):
    port = free_port()
    log = open(router_log, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
         "--port", str(port), "--policy", "cache_aware", "--prometheus-port",
         str(free_port()), "--log-level", "debug", "--worker-urls", *[w.url for w in workers]],
        stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, router_log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _router_lines(router_log, text: str) -> list[str]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", router_log.read_text())
    return [line for line in plain.splitlines() if text in line]


def _routed(worker: ServerProc) -> int:
    return httpx.get(f"{worker.url}/load").json()["replicas"][0]["num_routed_requests"]


def test_the_endpoints_a_router_asks_a_worker_for(workers):
    url = workers[0].url
    info = httpx.get(f"{url}/get_model_info").json()
    assert info["model_path"] == "tiny" and info["is_generation"] is True
    server = httpx.get(f"{url}/get_server_info").json()
    assert server["block_size"] == 16 and server["data_parallel_size"] == 1
    assert httpx.get(f"{url}/get_load").json()["load"] == 0
    assert httpx.get(f"{url}/health_generate", timeout=30).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_streamed_chat_request_goes_through_the_router(router, workers):
    assert httpx.get(f"{router}/v1/models").json()["data"][0]["id"] == "tiny"
    body = {"model": "tiny", "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hello there"}]}
    with httpx.stream("POST", f"{router}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["delta"].get("content") or "") for c in chunks) > 0


def test_a_shared_prefix_workload_lands_on_one_worker(router, workers):
    before = [_routed(w) for w in workers]
    for i in range(8):
        r = httpx.post(f"{router}/v1/chat/completions", timeout=30, json={
            "model": "tiny", "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Question number {i}?"}]})
        assert r.status_code == 200, r.text
    added = sorted(_routed(w) - b for w, b in zip(workers, before))
    assert added == [0, 8], added


def test_the_router_routes_on_the_token_ids_the_workers_render(router, router_log):
    # NOTE: counted from here on: a worker's first render (its chat template compiled) may
    # outlast the router's probe on a loaded machine, which then routes that one on text
    before = len(_router_lines(router_log, "Cache prefix decision"))
    fallbacks = len(_router_lines(router_log, "preparation unavailable"))
    chat = {"model": "tiny", "max_tokens": 2,
            "messages": [{"role": "user", "content": "Which token ids?"}]}
    assert httpx.post(f"{router}/v1/chat/completions", json=chat, timeout=30).status_code == 200
    completion = {"model": "tiny", "max_tokens": 2, "prompt": "Which token ids?"}
    assert httpx.post(f"{router}/v1/completions", json=completion,
                      timeout=30).status_code == 200
    time.sleep(0.5)  # the log line is written as the request is routed; let it reach the file
    assert len(_router_lines(router_log, "Cache prefix decision")) >= before + 2
    assert len(_router_lines(router_log, "preparation unavailable")) == fallbacks
