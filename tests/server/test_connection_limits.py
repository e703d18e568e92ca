"""Limits at the edge (frontend/http/connection_guard.py) on a real server (mock engine):
stalled, trickled and silent connections get a 408 and are closed at the header deadline, the
connection caps (per client address and in all) answer 503 at once, a request the HTTP parser
rejects gets a JSON 400, and normal traffic goes on beside all of it."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from server_proc import ServerProc

HEADER_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--header-read-timeout", str(HEADER_TIMEOUT),
                   "--max-connections", "12", "--max-connections-per-client", "8", timeout=120)
    yield s
    assert s.stop() == 0


def connect(server, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                    source_address=(source, 0))
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def answer(data: bytes) -> tuple[int, dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def completion_ok(server) -> bool:
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   timeout=30)
    return r.status_code == 200


@pytest.mark.parametrize("how", ["silent", "stalled", "trickled"])
def test_slow_headers_get_a_408_at_the_deadline(server, how):
    sock = connect(server)
    start = time.monotonic()
    if how == "stalled":
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    elif how == "trickled":
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: 1234567890\r\n":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
    status, body = answer(read_all(sock))
    waited = time.monotonic() - start
    assert status == 408 and "header" in body["error"]["message"]
    assert HEADER_TIMEOUT - 0.2 <= waited <= HEADER_TIMEOUT + 3
    assert completion_ok(server)


def test_a_kept_alive_connection_serves_requests_then_idles_out(server):
    with httpx.Client(base_url=server.url) as client:
        for _ in range(3):  # one connection, several requests, each under the deadline
            assert client.get("/health").status_code == 200
            time.sleep(HEADER_TIMEOUT / 2)


def test_connection_caps_answer_503_at_once(server):
    held = [connect(server) for _ in range(8)]  # this address's maximum
    try:
        extra = connect(server)
        status, body = answer(read_all(extra))
        assert status == 503 and "per address" in body["error"]["message"]
        held += [connect(server, "127.0.0.2") for _ in range(4)]  # the server's maximum
        time.sleep(0.2)
        other = connect(server, "127.0.0.3")
        status, body = answer(read_all(other))
        assert status == 503 and "maximum of 12" in body["error"]["message"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert completion_ok(server)  # the slots are free again


def test_unparsable_request_is_a_json_400(server):
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
    status, body = answer(read_all(sock))
    assert status == 400 and "could not be parsed" in body["error"]["message"]


def test_stalled_connections_do_not_stop_traffic(server):
    stalled = [connect(server, "127.0.0.4") for _ in range(6)]
    try:
        for sock in stalled:
            sock.sendall(b"GET / HTTP/1.1\r\n")
        assert completion_ok(server)
    finally:
        for sock in stalled:
            sock.close()
