"""Two ``radixserve serve`` processes on one --kv-disk-cache folder (as data-parallel
replicas or two servers on one machine): the pages one evicts, the other reads back, shown
in ``usage.prompt_tokens_details.cached_tokens`` and at /metrics, with the same greedy tokens
and logprobs as computing them."""

from __future__ import annotations

import time

import httpx
from server_proc import ServerProc

BS = 16
A = [(7 * i) % 3000 + 100 for i in range(100)]
B = [(11 * i) % 3000 + 50 for i in range(170)]
C = [(13 * i) % 3000 + 70 for i in range(170)]
FLAGS = ("--block-size", str(BS), "--num-kv-blocks", "12")


def complete(server: ServerProc, prompt: list[int]) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def metric(server: ServerProc, line_start: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(line_start))


def test_two_servers_share_a_folder(tmp_path):
    folder = str(tmp_path / "kv")
    first = ServerProc(*FLAGS, "--kv-disk-cache", folder)
    second = ServerProc(*FLAGS, "--kv-disk-cache", folder)
    try:
        reference = complete(first, A)
        assert reference["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        complete(first, B)
        complete(first, C)  # A's pages evicted from the first's pool, onto the disk
        time.sleep(0.5)  # its writer thread
        again = complete(second, A)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert again["choices"][0]["text"] == reference["choices"][0]["text"]
        assert again["choices"][0]["logprobs"] == reference["choices"][0]["logprobs"]
        deadline = time.monotonic() + 10
        while metric(second, 'radixserve:kv_disk_pages_total{') == 0:
            assert time.monotonic() < deadline, "no disk pages at /metrics"
            time.sleep(0.5)
        assert metric(second, 'radixserve:kv_disk_pages_total{model_name="') >= 6
        assert metric(second, "radixserve:external_prefix_cache_hits_total") == 96
    finally:
        first.stop()
        second.stop()
    # every full page of A, B and C: evicted, or saved when the servers stopped
    pages = [f for d in (tmp_path / "kv").iterdir() for sub in d.iterdir() for f in sub.iterdir()]
    assert len(pages) == sum((len(p) - 1) // BS for p in (A, B, C))


def test_no_kv_disk_cache_is_off(tmp_path):
    server = ServerProc(*FLAGS, "--no-kv-disk-cache", "--kv-disk-cache", str(tmp_path))
    try:
        complete(server, A)
        complete(server, B)
        complete(server, C)
        assert complete(server, A)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert not list(tmp_path.iterdir())
    finally:
        server.stop()
