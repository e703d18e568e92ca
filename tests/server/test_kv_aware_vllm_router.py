"""Two workers (the embedded model, KV events on with vLLM's defaults: map events, topic "")
behind vllm-router's kv_aware policy, which indexes the workers' KV from their events alone:
a repeated chat is credited its cached prefix at the worker that stored it (the router's
debug log: ``credited_prefix_tokens``), and after ``POST /reset_prefix_cache`` on that
worker (AllBlocksCleared) nothing is credited any more. Skipped, saying so, where the
router package is not installed."""

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

SYSTEM = "You answer questions about lighthouses, briefly. " * 12
DECISION = re.compile(r'KV prefix decision .*worker="([^"]+)".*credited_prefix_tokens=(\d+)')


@pytest.fixture(scope="module")
def workers():
    ws = []
    for _ in range(2):
        events = free_port()
        config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{events}"}
        w = ServerProc("--served-model-name", "smol", "--threads", "1",
                       "--kv-events-config", json.dumps(config), timeout=240)
        w.events = events
        ws.append(w)
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(scope="module")
def router(workers, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("router") / "router.log"
    sources = [a for w in workers for a in
               ("--kv-event-source", f"{w.url}=tcp://127.0.0.1:{w.events}")]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--policy", "kv_aware", "--kv-event-model", "smol",
             "--kv-event-block-size", "16", "--prometheus-port", str(free_port()),
             "--log-level", "debug", "--worker-urls", *[w.url for w in workers], *sources],
            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, log_path)
        yield url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _chat(url: str) -> None:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "smol", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Why are they painted in stripes?"}]})
    assert r.status_code == 200, r.text


def _last_decision(log_path) -> tuple[str, int]:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log_path.read_text())
    found = DECISION.findall(plain)
    assert found, "no kv_aware decision logged"
    return found[-1][0], int(found[-1][1])


def test_events_credit_the_prefix_and_a_reset_clears_it(router):
    url, log_path = router
    _chat(url)
    first, credited = _last_decision(log_path)
    assert credited == 0  # nothing cached anywhere yet
    time.sleep(0.5)  # the worker's events reach the router
    _chat(url)
    second, credited = _last_decision(log_path)
    assert second == first and credited >= 16 * 4  # its system prompt's pages at least
    assert httpx.post(f"{first}/reset_prefix_cache", timeout=30).status_code == 200
    time.sleep(0.5)
    _chat(url)
    assert _last_decision(log_path)[1] == 0
