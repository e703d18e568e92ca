"""Security attacks of issue 62 item 5: what a client without the API key, or a web page by DNS
rebinding, can get from the server.

1. Keyless routes: against a server with ``--api-key``, every route of /openapi.json and the
   ones it leaves out (the router info routes, SGLang's names, the pages' data) is asked
   without the key; each must be a 401 but /health, /version, /metrics and the pages' static
   files (HTML, scripts: no data).
2. Rebinding Host: a request naming a host a web page owns (``Host: attacker.example``) must be
   a 403 on every route, with or without the key, on a server bound to loopback; the names
   clients use (``localhost``, ``127.0.0.1``, an ``--allowed-hosts`` name) must be answered.
3. KV-event sockets: the PUB and replay sockets of the default config must listen on loopback
   only (read from /proc/net/tcp*: no authentication is possible on them); a config binding
   ``tcp://*`` must be refused at the command line unless ``"allow_remote": true``. The mock
   engine publishes nothing, so without ``--real`` the engine's publisher is built here.
4. LoRA routes: without ``--enable-lora-runtime-updates`` a load of an existing and of a
   missing path must be the same 404 (no existence oracle); with it, paths outside
   ``--lora-adapters-dir`` (absolute, ``..``, a symbolic link out) the same 400.
5. Cross-site GET /flush_cache (an ``<img>`` on any page, server without a key): 403 when the
   browser's headers name another site; 200 for curl and routers (no such headers).

Prints each attack with ``held`` or ``BROKEN`` and exits 1 if any broke.

    .venv/bin/python benchmarks/reliability/security_attacks.py [--real]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import httpx
from common import add_server_args, cpu_name, server
from server_proc import free_port

KEY = "probe-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPEN = {"/health", "/version", "/metrics", "/", "/ui/engine", "/ui/static/chat.js"}
HIDDEN = [("GET", "/model_info"), ("GET", "/server_info"), ("GET", "/get_model_info"),
          ("GET", "/get_server_info"), ("GET", "/get_load"), ("GET", "/load"),
          ("GET", "/v1/engine/state"), ("GET", "/flush_cache"), ("GET", "/openapi.json"),
          ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/api/version")]
REBINDING = "attacker.example"
ALLOWED = "llm.example"


def table(url: str) -> list[tuple[str, str]]:
    """Every (method, path) the server describes, ``{name}`` filled in, and the hidden ones."""
    schema = httpx.get(f"{url}/openapi.json", headers=AUTH, timeout=30).json()
    routes = {(method.upper(), re.sub(r"\{\w+\}", "x", path))
              for path, item in schema["paths"].items() for method in item}
    return sorted(routes | set(HIDDEN) | {("GET", p) for p in OPEN})


def keyless_routes(url: str) -> list[str]:
    broken = []
    for method, path in table(url):
        r = httpx.request(method, url + path, json={} if method == "POST" else None, timeout=30)
        expected = 200 if path in OPEN else 401
        if r.status_code != expected:
            broken.append(f"{method} {path}: {r.status_code} (expected {expected})")
    return broken


def rebinding(url: str, port: int, auth: dict[str, str]) -> list[str]:
    broken = []
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/get_server_info"),
                         ("GET", "/metrics"), ("GET", "/"), ("POST", "/v1/completions"),
                         ("POST", "/api/generate"), ("POST", "/v1/messages")):
        for host in (REBINDING, f"{REBINDING}:{port}", f"localhost.{REBINDING}"):
            r = httpx.request(method, url + path, headers={**auth, "Host": host},
                              json={"prompt": "hi", "max_tokens": 1} if method == "POST"
                              else None, timeout=30)
            if r.status_code != 403:
                broken.append(f"{method} {path} Host {host}: {r.status_code} (expected 403)")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", ALLOWED):
        r = httpx.get(f"{url}/v1/models", headers={**auth, "Host": host}, timeout=30)
        if r.status_code != 200:
            broken.append(f"GET /v1/models Host {host}: {r.status_code} (expected 200)")
    return broken


def listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = []
    for table_ in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table_) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    found.append(local.rsplit(":", 1)[0])
    return found


_LOOPBACK = ("0100007F", "00000000000000000000000001000000")  # 127.0.0.1, ::1


def kv_event_sockets(args: argparse.Namespace) -> list[str]:
    from radixserve.config import KVEventsConfig
    from radixserve.engine.kv_events import ZmqPublisher

    broken, replay = [], free_port()
    fields = {"enable_kv_cache_events": True, "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    if args.real:
        ctx = server(args, "--kv-events-config", json.dumps(fields))
    else:
        ctx = _publisher(ZmqPublisher, KVEventsConfig.parse(fields))
    with ctx:
        for port in (5557, replay):
            addresses = listening(port)
            if not addresses or any(a not in _LOOPBACK for a in addresses):
                broken.append(f"port {port} listens on {addresses or 'nothing'} (loopback only)")
    wide = json.dumps({**fields, "endpoint": "tcp://*:5557"})
    proc = subprocess.Popen([sys.executable, "-m", "radixserve", "serve", "--mock-engine",
                             "--port", str(free_port()), "--kv-events-config", wide],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)  # a refusal is immediate
    except subprocess.TimeoutExpired:
        proc.terminate()
        _, err = proc.communicate()
        broken.append("tcp://* endpoint: the server started")
    else:
        if proc.returncode == 0 or "allow_remote" not in err:
            broken.append(f"tcp://* endpoint: exit {proc.returncode}, {err.strip()[-200:]!r}")
    return broken


class _publisher:
    def __init__(self, cls, config) -> None:
        self.pub = cls(config, "CPU")

    def __enter__(self):
        return self.pub

    def __exit__(self, *exc) -> None:
        self.pub.close()


def _lora_load(url: str, path: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                      json={"lora_name": "probe", "lora_path": path})


def lora_routes(args: argparse.Namespace) -> list[str]:
    broken = []
    with server(args) as s:
        answers = [_lora_load(s.url, path) for path in ("/etc", "/no/such/path")]
        if [r.status_code for r in answers] != [404, 404] or answers[0].text != answers[1].text:
            broken.append("unmounted: " + "; ".join(f"{r.status_code} {r.text[:80]}"
                                                    for r in answers))
    with tempfile.TemporaryDirectory() as root:
        inside = os.path.join(root, "adapters")
        os.makedirs(inside)
        os.symlink("/etc", os.path.join(inside, "out"))
        try:
            with server(args, "--enable-lora-runtime-updates", "--lora-adapters-dir",
                        inside) as s:
                answers = [_lora_load(s.url, path) for path in ("/etc", "/no/such/path",
                           "../adapters/../..", "out", f"{inside}/out")]
        except RuntimeError as exc:  # a server without the flags
            return [*broken, f"confined: {str(exc)[-120:]}"]
    if {r.status_code for r in answers} != {400} or len({r.text for r in answers}) > 1:
        broken.append("confined: " + "; ".join(f"{r.status_code} {r.text[:80]}"
                                              for r in answers))
    return broken


def cross_site_flush(url: str) -> list[str]:
    broken = []
    for headers in ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "image"},
                    {"Origin": "https://attacker.example"},
                    {"Referer": "https://attacker.example/cat.html"}):
        r = httpx.get(f"{url}/flush_cache", headers=headers, timeout=30)
        if r.status_code != 403:
            broken.append(f"GET /flush_cache {headers}: {r.status_code} (expected 403)")
    r = httpx.get(f"{url}/flush_cache", timeout=30)
    if r.status_code != 200:
        broken.append(f"GET /flush_cache from curl: {r.status_code} (expected 200)")
    return broken


def report(name: str, broken: list[str]) -> bool:
    print(f"{name}: {'BROKEN' if broken else 'held'}")
    for line in broken:
        print(f"    {line}")
    return not broken


def main(args: argparse.Namespace) -> int:
    print(f"CPU: {cpu_name()}; engine: {'embedded model' if args.real else 'mock'}")
    held = True
    with server(args, "--api-key", KEY, "--allowed-hosts", ALLOWED) as s:
        held &= report("keyless routes (--api-key)", keyless_routes(s.url))
        held &= report("rebinding Host, with the key", rebinding(s.url, s.port, AUTH))
    with server(args, "--allowed-hosts", ALLOWED) as s:
        held &= report("rebinding Host, server without a key", rebinding(s.url, s.port, {}))
        held &= report("cross-site GET /flush_cache", cross_site_flush(s.url))
    held &= report("KV-event sockets off loopback", kv_event_sockets(args))
    held &= report("LoRA routes: gate and adapters folder", lora_routes(args))
    return 0 if held else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    sys.exit(main(parser.parse_args()))
