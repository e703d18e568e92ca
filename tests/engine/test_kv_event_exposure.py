"""KV-event sockets stay on this machine unless asked (issue 62 item 5): anyone who can reach
the PUB or replay socket reads every prompt's token ids, and ZMQ has no API key. The default
endpoint binds loopback; a bind on any other interface (``*``, ``0.0.0.0``, an address, a
name) is refused without ``"allow_remote": true``; connecting out to a named host (vLLM's
reading of a plain ``tcp://HOST:PORT``) is the operator's choice and stays allowed."""

from __future__ import annotations

import socket

import pytest

from radixserve.config import KVEventsConfig, kv_event_endpoint_binds
from radixserve.engine.kv_events import ZmqPublisher


def _on(**fields) -> KVEventsConfig:
    return KVEventsConfig.parse({"enable_kv_cache_events": True, **fields})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_default_endpoint_is_a_loopback_bind():
    config = _on()
    assert config.endpoint == "tcp://127.0.0.1:5557" and not config.allow_remote
    assert kv_event_endpoint_binds(config.endpoint)


def test_a_loopback_endpoint_binds_and_listens_only_there():
    port = _free_port()
    pub = ZmqPublisher(_on(endpoint=f"tcp://127.0.0.1:{port}"), "CPU")
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # listening (a connecting PUB would leave nothing to connect to)
    finally:
        pub.close()


@pytest.mark.parametrize("field,endpoint", [
    ("endpoint", "tcp://*:5557"), ("endpoint", "tcp://[::]:5557"),
    ("endpoint", "tcp://*:*"), ("replay_endpoint", "tcp://*:5558"),
    ("replay_endpoint", "tcp://0.0.0.0:5558"), ("replay_endpoint", "tcp://10.1.2.3:5558"),
    ("replay_endpoint", "tcp://eth0:5558"), ("replay_endpoint", "tcp://example.com:5558")])
def test_a_bind_off_loopback_is_refused_without_allow_remote(field, endpoint):
    with pytest.raises(ValueError, match="allow_remote") as exc:
        _on(**{field: endpoint})
    assert endpoint in str(exc.value) and "every prompt" in str(exc.value)
    assert getattr(_on(**{field: endpoint}, allow_remote=True), field) == endpoint


@pytest.mark.parametrize("field,endpoint", [
    ("endpoint", "tcp://127.0.0.1:5557"), ("endpoint", "tcp://localhost:*"),
    ("endpoint", "tcp://[::1]:5557"), ("endpoint", "tcp://127.0.0.1:*"),
    ("endpoint", "ipc:///tmp/kv-events"), ("endpoint", "inproc://kv"),
    ("endpoint", "tcp://192.0.2.1:5557"),  # connects out: the operator named the host
    ("replay_endpoint", "tcp://127.0.0.1:5558"), ("replay_endpoint", "tcp://localhost:5558")])
def test_loopback_local_and_outgoing_endpoints_need_no_opt_in(field, endpoint):
    assert getattr(_on(**{field: endpoint}), field) == endpoint


def test_which_endpoints_bind():
    """vLLM's rule (``*``, ``::``, ipc://, inproc://) plus a loopback host (ours)."""
    binds = ["tcp://*:5557", "tcp://[::]:1", "ipc:///x", "inproc://x", "tcp://127.0.0.1:1",
             "tcp://127.3.0.1:1", "tcp://localhost:1", "tcp://[::1]:1", "tcp://10.0.0.1:*"]
    connects = ["tcp://10.0.0.1:5557", "tcp://router.internal:5557", "tcp://192.0.2.1:1"]
    assert all(kv_event_endpoint_binds(e) for e in binds)
    assert not any(kv_event_endpoint_binds(e) for e in connects)


def test_events_off_checks_nothing():
    """A config that publishes nothing binds nothing: its endpoint is not refused."""
    assert KVEventsConfig.parse({"endpoint": "tcp://*:5557"}).endpoint == "tcp://*:5557"
