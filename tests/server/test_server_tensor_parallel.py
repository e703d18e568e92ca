"""``radixserve serve --tensor-parallel-size 2`` on a tiny random Llama: a chat request answers
(greedy: the same text again after a restart; TP=2 against TP=1 is test_tensor_parallel.py's),
rank 1 runs as the engine-core process's child on its own CPUs,
a SIGKILLed rank 1 ends its engine, which the server restarts with both ranks, and a clean
stop leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest
from server_proc import ServerProc
from test_server_faults import _wait_gone

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "the quick brown fox"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def _rank_pids(engine_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(engine_pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split() if b"radixserve.engine.tp.worker" in _cmdline(int(p))]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _chat(url: str) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def server(tiny_hf_dirs):
    s = ServerProc("--model", str(tiny_hf_dirs["llama"]), "--served-model-name", "tiny",
                   "--num-kv-blocks", "64", "--quantization", "none",
                   "--tensor-parallel-size", "2", timeout=300)
    yield s
    engine = s.engine_pid()
    everything = s.engine_pids() + (_rank_pids(engine) if engine else [])
    assert s.stop() == 0
    assert not _wait_gone(everything)


@pytest.fixture(scope="module")
def first_answer(server):
    text = _chat(server.url)
    assert text
    return text


def test_a_chat_request_answers_from_two_ranks_on_their_own_cpus(server, first_answer):
    two = server
    assert _chat(two.url) == first_answer
    engine = two.engine_pid()
    (rank1,) = _rank_pids(engine)
    mine, theirs = os.sched_getaffinity(engine), os.sched_getaffinity(rank1)
    if len(os.sched_getaffinity(two.proc.pid)) >= 2:
        assert not mine & theirs, (mine, theirs)


def test_a_killed_rank_ends_its_engine_and_the_server_restarts_both(server, first_answer):
    two = server
    engine = two.engine_pid()
    (rank1,) = _rank_pids(engine)
    os.kill(rank1, signal.SIGKILL)
    # the engine notices at its next step (or while waiting); that request may fail
    httpx.post(f"{two.url}/v1/chat/completions", json=BODY, timeout=120)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        new = two.engine_pid()
        if new not in (None, engine) and _rank_pids(new):
            try:
                if httpx.get(f"{two.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    else:
        raise AssertionError("no new engine with its ranks came up")
    assert _wait_gone([engine, rank1], timeout=10) == []
    assert _chat(two.url) == first_answer
