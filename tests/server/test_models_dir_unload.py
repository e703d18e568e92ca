"""What a model's unload leaves behind in ``--models-dir``'s API process (issue 62): nothing.
Swapping two models (the embedded SmolLM2 under two names, mock engines, one loaded at a time)
keeps the API process's file descriptors and temp folders exactly at their level after the first
swap, and its RSS about flat; a stream open on a model being unloaded ends in its API's own way
(OpenAI: an error event then [DONE]; Ollama: a last {"error"} line) within the drain timeout,
and the model does unload."""

from __future__ import annotations

import concurrent.futures
from collections import Counter
import json
import os
import time

import httpx
import pytest
from server_proc import ServerProc
from test_models_dir import engines, states

from radixserve.models.default import default_model_path

MOCK = ("--mock-engine", "--kv-cache-memory-gb", "0.01")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two")
    for name in ("a", "b"):
        (folder / f"{name}.gguf").symlink_to(default_model_path())
    return str(folder)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmRSS:"))


def fds(pid: int) -> list[str]:
    """The process's open files by kind (pipe, socket, anon_inode, path), sorted."""
    kinds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            kinds.append(os.readlink(f"/proc/{pid}/fd/{fd}").split(":[")[0])
        except FileNotFoundError:
            pass
    return sorted(kinds)


def tree(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, subs, files in os.walk(root)
                  for n in subs + files)


def settled(read, expected, timeout: float = 5.0):
    """``read()`` once it equals ``expected`` (a closing connection takes a moment), else
    its last value."""
    deadline = time.monotonic() + timeout
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def test_swaps_leak_no_fd_folder_or_memory(two_models, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    s = ServerProc("--models-dir", two_models, "--max-loaded-models", "1", *MOCK,
                   env={"TMPDIR": str(tmp)})
    pid = s.proc.pid

    def swap(i: int) -> None:
        answer = httpx.post(f"{s.url}/v1/completions", timeout=120,
                            json={"model": "ab"[i % 2], "prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200, answer.text

    try:
        for i in range(2):  # both models seen once: what stays now is the baseline
            swap(i)
        base_fds, base_rss = fds(pid), rss_mb(pid)
        base_tree = [p.replace("b-2", "X") for p in tree(str(tmp))]
        for i in range(2, 12):
            swap(i)
        # b loaded again (as at the baseline), under its 12th load's folder
        after = settled(lambda: fds(pid), base_fds)
        # nothing the swaps opened stays open (a connection still closing at the baseline
        # may be gone by now: fewer is no leak)
        assert not Counter(after) - Counter(base_fds), (after, base_fds)
        assert [p.replace("b-12", "X") for p in tree(str(tmp))] == base_tree
        grown = rss_mb(pid) - base_rss
        assert grown < 60, f"API process grew {grown:.0f} MB over 10 swaps"
    finally:
        assert s.stop() == 0
    assert tree(str(tmp)) == [] and engines(s) == []


def read_stream(url: str, path: str, body: dict, first: concurrent.futures.Future) -> list:
    """The stream's lines (``first`` set once the first arrives), and how long it lasted."""
    lines, began = [], time.monotonic()
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(line)
                if not first.done():
                    first.set_result(None)
    return lines + [time.monotonic() - began]


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_unload_ends_an_open_stream_in_its_own_way(two_models, api):
    s = ServerProc("--models-dir", two_models, *MOCK, "--mock-step-ms", "50",
                   "--drain-timeout", "1")
    try:
        if api == "openai":
            path, body = "/v1/chat/completions", {"model": "a", "stream": True,
                                                  "max_tokens": 4000, "messages": [
                                                      {"role": "user", "content": "hi"}]}
        else:
            path, body = "/api/generate", {"model": "a", "prompt": "hi",
                                           "options": {"num_predict": 4000}}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = concurrent.futures.Future()
            stream = pool.submit(read_stream, s.url, path, body, first)
            first.result(timeout=60)
            began = time.monotonic()
            unload = httpx.post(f"{s.url}/models/unload", json={"model": "a"}, timeout=30)
            assert unload.json()["was_loaded"] and time.monotonic() - began < 8
            *lines, lasted = stream.result(timeout=15)
        if api == "openai":
            assert lines[-1] == "data: [DONE]"
            assert "error" in json.loads(lines[-2][len("data: "):]), lines[-3:]
        else:
            assert "error" in json.loads(lines[-1]), lines[-2:]
        assert lasted < 30 and states(s)["a"] == "unloaded" and engines(s) == []
        ok = httpx.post(f"{s.url}/v1/completions", timeout=60,
                        json={"model": "a", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200  # loads again
    finally:
        assert s.stop() == 0
