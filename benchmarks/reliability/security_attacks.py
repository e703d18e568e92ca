"""Security attacks of issue 62 item 5: what a client without the API key, or a web page by DNS
rebinding, can get from the server.

1. Keyless routes: against a server with ``--api-key``, every route of /openapi.json and the
   ones it leaves out (the router info routes, SGLang's names, the pages' data) is asked
   without the key; each must be a 401 but /health, /version, /metrics and the pages' static
   files (HTML, scripts: no data).
2. Rebinding Host: a request naming a host a web page owns (``Host: attacker.example``) must be
   a 403 on every route, with or without the key, on a server bound to loopback; the names
   clients use (``localhost``, ``127.0.0.1``, an ``--allowed-hosts`` name) must be answered.

Prints each attack with ``held`` or ``BROKEN`` and exits 1 if any broke.

    .venv/bin/python benchmarks/reliability/security_attacks.py [--real]
"""

from __future__ import annotations

import argparse
import re
import sys

import httpx
from common import add_server_args, cpu_name, server

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
    return 0 if held else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    sys.exit(main(parser.parse_args()))
