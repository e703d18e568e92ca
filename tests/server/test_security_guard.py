"""Issue 62 item 5: with ``--api-key`` every route but the probes (/health, /version, /metrics)
and the pages' static files needs the key, answering 401 in its own API's error shape; and a
Host header naming neither this machine nor an allowed host (a DNS-rebinding web page) is a 403
before anything else (`host_check`). In-process over every route table (single model and
--models-dir), then end to end against ``radixserve serve --mock-engine``."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from asgi_call import asgi_call
from server_proc import ServerProc

from radixserve.frontend.anthropic.serving import send_anthropic_error
from radixserve.frontend.app import Guard
from radixserve.frontend.http.errors import send_error
from radixserve.frontend.http.host_check import HostPolicy, parse_allowed_hosts, startup_warning
from radixserve.frontend.http.limits import ServeLimits
from radixserve.frontend.http.router import Route, Router
from radixserve.frontend.llamacpp.routes import send_llamacpp_error
from radixserve.frontend.models_dir.routes import build_hub_app, shape_routes
from radixserve.frontend.ollama.routes import send_ollama_error

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
# served without the key: the probes, and the pages and their scripts (no data in them; the
# data they show comes from keyed routes such as /v1/engine/state)
OPEN = {"/health", "/version", "/metrics", "/", "/ui/engine", "/ui/static/"}
REBINDING = "attacker.example:8000"


def _is_openai(body) -> bool:
    return body["error"]["code"] == "invalid_api_key" and body["error"]["message"]


def _is_anthropic(body) -> bool:
    return body["type"] == "error" and body["error"]["type"] == "authentication_error"


def _is_ollama(body) -> bool:
    return isinstance(body["error"], str) and "API key" in body["error"]


def _is_llamacpp(body) -> bool:
    return body["error"]["code"] == 401 and body["error"]["type"] == "authentication_error"


# each API's 401 body, by the refusal writer of its routes' wire (a new wire must be added here)
SHAPES = {send_error: _is_openai, send_anthropic_error: _is_anthropic,
          send_ollama_error: _is_ollama, send_llamacpp_error: _is_llamacpp}


async def _call(app, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes = b"") -> tuple[int, bytes]:
    """(status, body) of one request to the ASGI ``app``."""
    status, _, data = await asgi_call(app, method, path, body, headers)
    return status, data


def _request_path(route: Route) -> str:
    path = route.path.replace("{", "").replace("}", "")  # /v1/responses/{id} -> .../id
    return path + "x" if route.is_prefix else path


def _single_model_table() -> list[Route]:
    return shape_routes(ServeLimits())


def _hub_table() -> list[Route]:
    hub = SimpleNamespace(drain=None)  # the guard refuses before any handler reads it
    return build_hub_app(hub, KEY, ServeLimits()).router.routes


@pytest.mark.parametrize("table", [_single_model_table, _hub_table],
                         ids=["single-model", "models-dir"])
def test_api_key_guards_every_route_but_the_probes_and_pages(table):
    routes = table()
    open_paths = {r.path for r in routes if r.is_open}
    assert open_paths == OPEN, open_paths ^ OPEN
    app = Guard(Router(routes), KEY, 1 << 20)
    for route in routes:
        if route.is_open:
            continue
        method = "GET" if route.method == "*" else route.method
        status, body = asyncio.run(_call(app, method, _request_path(route)))
        assert status == 401, (route.method, route.path, status, body)
        assert SHAPES[route.wire.send_refusal](json.loads(body)), (route.path, body)


@pytest.mark.parametrize("path", ["/get_model_info", "/get_server_info", "/model_info",
                                  "/server_info", "/get_load"])
def test_api_key_guards_the_router_info_routes(path):
    routes = _single_model_table()
    status, body = asyncio.run(_call(Guard(Router(routes), KEY, 1 << 20), "GET", path))
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"


# --- the Host check ----------------------------------------------------------------------------


@pytest.mark.parametrize("host", [
    None, "127.0.0.1", "127.0.0.1:8000", "127.3.4.5:1", "localhost", "LOCALHOST:8000",
    "localhost.:8000", "app.localhost:8000", "[::1]:8000", "[::1]", "10.1.2.3:8000",
    "[fe80::1]:80", "gpu-box.local:8000", "gpu-box.internal", "x", "radixserve:8000",
])
def test_host_addresses_and_names_outside_public_dns_are_allowed_by_default(host):
    policy = HostPolicy()
    assert policy.allows(None if host is None else host.encode()), host


@pytest.mark.parametrize("host", [
    REBINDING, "attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io:8000",
    "evil.localhost.example", "", ":8000", "[::1", "a b", "localhost@attacker.example",
    "attacker.example/", "xn--80ak6aa92e.example",
])
def test_host_names_a_web_page_can_own_are_refused(host):
    policy = HostPolicy()
    assert not policy.allows(host.encode()), host
    # binding every interface without a key changes nothing: the key is what opens it
    assert not HostPolicy(bind_host="0.0.0.0").allows(host.encode()), host


def test_host_rule_bound_address_allowed_hosts_and_the_key():
    assert HostPolicy(bind_host="llm.lan").allows(b"LLM.lan:8000")
    named = HostPolicy(allowed_hosts=("llm.example.com", "*.corp.example"))
    assert named.allows(b"llm.example.com") and named.allows(b"a.b.corp.example:443")
    assert not named.allows(b"corp.example") and not named.allows(b"xllm.example.com")
    assert HostPolicy(allowed_hosts=("*",)).allows(REBINDING.encode())
    # bound to a non-loopback address with a key: remote access meant, the key guards it
    assert HostPolicy(bind_host="0.0.0.0", has_api_key=True).allows(REBINDING.encode())
    assert HostPolicy(bind_host="::", has_api_key=True).allows(REBINDING.encode())
    # bound to loopback, the key does not open it: the probes and pages would still answer
    assert not HostPolicy(has_api_key=True).allows(REBINDING.encode())
    assert not HostPolicy(bind_host="localhost", has_api_key=True).allows(b"attacker.example")


def test_host_star_without_a_key_warns_at_start():
    assert "DNS rebinding" in startup_warning(HostPolicy(allowed_hosts=("*",)))
    assert startup_warning(HostPolicy(allowed_hosts=("*",), has_api_key=True)) is None
    assert startup_warning(HostPolicy(bind_host="0.0.0.0", allowed_hosts=("a.example",))) is None


@pytest.mark.parametrize("value, expected", [
    ("a.example", ["a.example"]), ("A.example, b.example", ["a.example", "b.example"]),
    ("*", ["*"]), ("*.corp.example", ["*.corp.example"]), ("10.0.0.1", ["10.0.0.1"]),
    ("[::1]", ["::1"]),
])
def test_allowed_hosts_parses(value, expected):
    assert parse_allowed_hosts(value) == expected


@pytest.mark.parametrize("value", ["http://a.example", "a.example:8000", "a.example/x", "",
                                   "a..example", "*a.example", "a.*.example", " , "])
def test_allowed_hosts_refuses_what_is_not_a_host(value):
    with pytest.raises(ValueError):
        parse_allowed_hosts(value)


def test_host_check_comes_first_in_each_apis_shape():
    routes = _single_model_table()
    app = Guard(Router(routes), KEY, 1 << 20, hosts=HostPolicy(has_api_key=True))
    bad = {"Host": REBINDING, **AUTH}
    for path, shape in (("/health", "error"), ("/v1/models", "error"),
                        ("/api/tags", "ollama"), ("/v1/messages", "anthropic")):
        method = "POST" if path == "/v1/messages" else "GET"
        status, body = asyncio.run(_call(app, method, path, bad, b"{}" * (method == "POST")))
        assert status == 403, (path, body)
        error = json.loads(body)
        if shape == "ollama":
            assert "attacker.example" in error["error"]
        elif shape == "anthropic":
            assert error["error"]["type"] == "permission_error"
        else:
            assert error["error"]["code"] == "host_not_allowed"
            assert "--allowed-hosts" in error["error"]["message"]
    status, _ = asyncio.run(_call(app, "GET", "/health", {"Host": "127.0.0.1:9"}))
    assert status == 200


# --- end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed():
    s = ServerProc("--mock-engine", "--api-key", KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def keyless():
    s = ServerProc("--mock-engine", "--allowed-hosts", "llm.example,*.corp.example")
    yield s
    assert s.stop() == 0


def test_key_server_info_routes_need_the_key(keyed):
    for path in ("/get_model_info", "/get_server_info", "/model_info", "/server_info",
                 "/get_load", "/load", "/v1/engine/state", "/api/tags", "/api/version"):
        r = httpx.get(keyed.url + path)
        assert r.status_code == 401, (path, r.text)
        assert httpx.get(keyed.url + path, headers=AUTH).status_code == 200, path
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(keyed.url + path).status_code == 200, path


def test_host_rebinding_refused_end_to_end(keyed, keyless):
    for s, auth in ((keyed, AUTH), (keyless, {})):
        r = httpx.get(s.url + "/v1/models", headers={"Host": REBINDING, **auth})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        for host in (f"localhost:{s.port}", f"127.0.0.1:{s.port}"):
            r = httpx.get(s.url + "/v1/models", headers={"Host": host, **auth})
            assert r.status_code == 200, (host, r.text)
    for host in ("llm.example", "llm.example:80", "gpu.corp.example"):
        assert httpx.get(keyless.url + "/v1/models", headers={"Host": host}).status_code == 200
    r = httpx.post(keyless.url + "/v1/completions", headers={"Host": REBINDING},
                   json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 403
