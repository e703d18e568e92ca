"""KV-event subscribers cannot pin the engine's memory (issue 62 item 7): each one's queue is
bounded by the PUB socket's high-water mark (a small default), a subscriber reaching that mark is
counted (``num_subscribers_behind``, on /metrics as
``radixserve:kv_event_subscribers_dropped_total{reason="behind"}``), and at most
``max_subscribers`` are served at once on each socket, the others disconnected and counted. Before: a subscriber that never read held 100,000
batches (~330 MB), its losses went uncounted, and subscribers were unlimited."""

from __future__ import annotations

import time

import pytest
import zmq
from kv_event_wire import BS, DECODER

from radixserve.config import KVEventsConfig
from radixserve.core.kv.kv_events import BlockStored as CoreStored
from radixserve.engine.kv_events import ZmqPublisher

# ~80 KB on the wire: 400 of them overflow the kernel's socket buffers (4 MB at most) too
_BATCH = [CoreStored(list(range(1024)), None, [70_000 + t for t in range(1024 * BS)], BS)]


def _publisher(**fields) -> ZmqPublisher:
    return ZmqPublisher(KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*", **fields), "CPU")


def _sub(ctx: zmq.Context, endpoint: str, *, rcvhwm: int = 1000) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, rcvhwm)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def _received(sub: zmq.Socket, quiet_ms: int = 300) -> list[int]:
    seqs = []
    while sub.poll(quiet_ms):
        _, seq, payload = sub.recv_multipart()
        DECODER.decode(payload)
        seqs.append(int.from_bytes(seq, "big"))
    return seqs


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_default_high_water_mark_bounds_a_stuck_subscriber():
    # batches of a few KB: 1,000 of them pin a few MB per stuck subscriber, not 330 MB
    assert KVEventsConfig().hwm <= 1000
    assert 1 <= KVEventsConfig().max_subscribers <= 64


def test_a_stuck_subscribers_misses_are_counted_and_the_others_get_everything():
    pub = _publisher(hwm=20)
    ctx = zmq.Context()
    stuck, reader = _sub(ctx, pub.endpoint, rcvhwm=1), _sub(ctx, pub.endpoint)
    try:
        time.sleep(0.3)  # the subscriptions reach the publisher
        seqs = []
        for i in range(400):
            pub.publish(_BATCH)
            if i % 10 == 9:  # the reader keeps up; the stuck one never reads
                _wait_for(lambda n=i: pub.num_published + pub.num_dropped_events >= n)
                seqs += _received(reader, 0)
        _wait_for(lambda: pub._queue.empty())
        seqs += _received(reader)
        behind, dropped = pub.num_subscribers_behind, pub.num_dropped_events
    finally:
        pub.close()
        stuck.close(linger=0), reader.close(linger=0)
        ctx.term()
    assert seqs == list(range(400))
    assert behind >= 1, "the stuck subscriber is counted"
    assert dropped == 0  # no batch was lost for every subscriber


def test_subscribers_beyond_the_limit_are_disconnected():
    pub = _publisher(max_subscribers=2)
    ctx = zmq.Context()
    subs = [_sub(ctx, pub.endpoint) for _ in range(2)]
    try:
        time.sleep(0.3)
        extra = _sub(ctx, pub.endpoint)
        _wait_for(lambda: pub.num_refused_subscribers >= 1)
        for _ in range(5):
            pub.publish(_BATCH)
        got = [len(_received(s)) for s in (*subs, extra)]
        # the refused one keeps reconnecting (ZMQ does) and being refused until it leaves;
        # then one served leaves, and a newcomer is served
        _wait_for(lambda: pub.num_refused_subscribers >= 2)
        extra.close(linger=0)
        subs[0].close(linger=0)
        time.sleep(0.3)
        late = _sub(ctx, pub.endpoint)
        time.sleep(0.3)
        pub.publish(_BATCH)
        got_late = len(_received(late))
        refused = pub.num_refused_subscribers
    finally:
        pub.close()
        for s in (*subs, extra, late):
            s.close(linger=0)
        ctx.term()
    assert got == [5, 5, 0]
    assert got_late == 1 and refused >= 2


@pytest.mark.parametrize("field", ["max_subscribers", "hwm"])
def test_limits_are_validated(field):
    with pytest.raises(ValueError, match=field):
        KVEventsConfig.parse({"enable_kv_cache_events": True, field: 0})


def test_the_counts_reach_the_engine_stats_and_metrics():
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from radixserve.core.reports import SchedulerStats
    from radixserve.engine.core_proc import engine_stats
    from radixserve.engine.kv_events import KVEventsOutlet
    from radixserve.frontend.http.metrics import _EngineCollector

    publisher = SimpleNamespace(num_dropped=0, num_dropped_events=3, num_subscribers_behind=2,
                                num_refused_subscribers=5)
    engine = SimpleNamespace(scheduler=SimpleNamespace(stats=SchedulerStats),
                             kv_events=KVEventsOutlet(publisher=publisher))
    stats = engine_stats(engine)
    assert (stats.num_kv_event_subscribers_behind, stats.num_kv_event_subscribers_refused) == (2, 5)
    registry = CollectorRegistry()
    registry.register(_EngineCollector(SimpleNamespace(stats=stats, replicas=[]), "m"))
    text = generate_latest(registry).decode()
    assert 'radixserve:kv_event_subscribers_dropped_total{model_name="m",reason="behind"} 2.0' \
        in text
    assert 'reason="over_limit"} 5.0' in text
