"""What a server exposes without being asked (issue 62 item 5), on a mock-engine server:
vLLM's LoRA load/unload routes are mounted only with ``--enable-lora-runtime-updates``, and
then read adapters from ``--lora-adapters-dir`` only (a path anywhere else, existing or not,
is the same 400: no existence oracle); SGLang's ``GET /flush_cache`` is refused to a page
on another site (an ``<img src>`` on a server without a key); KV-event sockets bound off
loopback are refused at the command line without ``allow_remote``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from server_proc import ServerProc, free_port

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


@pytest.fixture(scope="module")
def plain():
    s = ServerProc("--mock-engine", timeout=120)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("exposure")
    inside = root / "adapters"
    inside.mkdir()
    (root / "secret").mkdir()
    (root / "secret" / "adapter_config.json").write_text("{}")
    os.symlink(root / "secret", inside / "escape")  # inside by name, outside by realpath
    return inside


@pytest.fixture(scope="module")
def updating(adapters_dir):
    s = ServerProc("--mock-engine", "--enable-lora-runtime-updates", "--lora-adapters-dir",
                   str(adapters_dir), timeout=120)
    yield s
    s.stop()


def test_lora_routes_are_not_mounted_without_the_flag(plain):
    """Before: mounted, a 404 for a missing path and a 400 for an existing one told any
    client which files exist."""
    answers = [httpx.post(f"{plain.url}{LOAD}", json={"lora_name": "x", "lora_path": path})
               for path in ("/etc", "/no/such/path")]
    assert [r.status_code for r in answers] == [404, 404], [r.text for r in answers]
    assert answers[0].json() == answers[1].json()
    assert "/etc" not in answers[0].text
    assert httpx.post(f"{plain.url}{UNLOAD}", json={"lora_name": "x"}).status_code == 404
    paths = httpx.get(f"{plain.url}/openapi.json").json()["paths"]
    assert LOAD not in paths and UNLOAD not in paths


def test_lora_paths_are_confined_to_the_adapters_dir(updating, adapters_dir):
    outside = [str(adapters_dir.parent / "secret"), "/etc", "/no/such/path", "../secret",
               f"{adapters_dir}/../secret", "escape", str(adapters_dir / "escape")]
    bodies = []
    for path in outside:
        r = httpx.post(f"{updating.url}{LOAD}", json={"lora_name": "x", "lora_path": path})
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == "lora_path" and "--lora-adapters-dir" in error["message"]
        bodies.append(r.json())
    assert all(b == bodies[0] for b in bodies), "the answer must not depend on the path"
    missing = httpx.post(f"{updating.url}{LOAD}", json={"lora_name": "x", "lora_path": "nope"})
    assert missing.status_code == 404, missing.text  # inside the folder: its listing is not secret
    assert UNLOAD in httpx.get(f"{updating.url}/openapi.json").json()["paths"]


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
    {"Origin": "http://evil.example"}, {"Origin": "null"},
    {"Referer": "http://evil.example/page.html"}])
def test_a_cross_site_get_flush_cache_is_refused(plain, headers):
    """Before: an <img src=http://127.0.0.1:8000/flush_cache> on any page flushed the cache."""
    r = httpx.get(f"{plain.url}/flush_cache", headers=headers)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "cross_site_request"


@pytest.mark.parametrize("headers", [
    {}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
    {"Origin": "SELF"}, {"Referer": "SELF/docs"}])
def test_get_flush_cache_from_routers_curl_and_the_server_own_pages(plain, headers):
    headers = {k: v.replace("SELF", plain.url) for k, v in headers.items()}
    r = httpx.get(f"{plain.url}/flush_cache", headers=headers)
    assert r.status_code == 200 and r.text.startswith("Cache flushed"), r.text
    assert httpx.post(f"{plain.url}/flush_cache").status_code == 200  # sglang's own client


def _serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixserve", "serve", "--mock-engine",
                           "--port", str(free_port()), *flags], capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_command_line_refuses_exposed_or_unconfined_setups(tmp_path):
    r = _serve("--enable-lora-runtime-updates")
    assert r.returncode != 0 and "--lora-adapters-dir" in r.stderr, r.stderr
    r = _serve("--enable-lora-runtime-updates", "--lora-adapters-dir", str(tmp_path / "none"))
    assert r.returncode != 0 and "not a folder" in r.stderr, r.stderr
    r = _serve("--lora-adapters-dir", str(tmp_path))
    assert r.returncode != 0 and "--enable-lora-runtime-updates" in r.stderr, r.stderr
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557"}
    r = _serve("--kv-events-config", json.dumps(config))
    assert r.returncode != 0 and "allow_remote" in r.stderr, r.stderr
