"""Publishing the prefix cache's KV events on ZMQ, on the wire vLLM workers use.

    engine thread, once a step              publisher thread
      sink.take() ─▶ queue ─(full: dropped, counted)─▶ encode ─▶ PUB [topic, seq, payload]
                                                          └─▶ replay buffer ◀─ ROUTER

Wire format (vLLM ``vllm/distributed/kv_events.py``):

- a multipart message ``[topic, seq (8 bytes, big-endian), payload]``, ``seq`` counting batches
  from 0 (given as a step hands its batch over, so a batch dropped leaves a gap);
- ``payload``: msgpack ``[ts, [event, ...], data_parallel_rank]``, hashes 64-bit ints
  (core/kv/kv_events.py), each event (``wire_format``)
  - ``map`` (vLLM since vllm-project/vllm#42892, June 2026; what vllm-router 0.1.17 and
    llm-d-kv-cache >= mid-2026 read): ``{"type": "BlockStored", "block_hashes",
    "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "extra_keys"}``, ``{"type": "BlockRemoved", "block_hashes", "medium"}``,
    ``{"type": "AllBlocksCleared"}``;
  - ``array`` (vLLM v0.10.2 .. #42892; consumers that never learnt the maps):
    ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
    medium]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``;
- replay: a DEALER/REQ sends ``[b"", start seq (8 bytes)]`` to the ROUTER and gets ``[b"",
  seq, payload]`` for each buffered batch from ``start``, then ``[b"", seq -1, b""]``.

Neither the queue nor the sockets can hold the engine up: ``publish`` never waits (a full
queue drops the batch), and the socket drops for a subscriber at its high-water mark (``hwm``
batches: what one that never reads can pin) or while nobody is connected. At most
``max_subscribers`` connections are served on each bound socket (kv_event_sockets.py).

Dropped events are counted (``num_dropped_events``: the events of batches the full queue
refused or the socket failed to send, lost for every subscriber), and so are the subscribers
that fell behind (``num_subscribers_behind``: each time one reached its high-water mark, from
which it misses batches until it has read its backlog; the socket is an XPUB that reports it,
kv_event_sockets.py; a replay asker cut off at its mark counts too) and those refused past
``max_subscribers`` (``num_refused_subscribers``). All three ride to the API process in the
engine's stats (``SchedulerStats``), served as ``radixserve:kv_events_dropped_total`` and
``radixserve:kv_event_subscribers_dropped_total{reason="behind"|"over_limit"}``. A
subscriber that missed batches sees a gap in ``seq`` and asks the replay socket for them. A
batch the queue refused leaves a gap too, but no replay holds it: its events are lost (the
subscriber's view of this worker's cache is stale until it is cleared or the pages age out).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from itertools import count

import msgspec
import zmq

from radixserve.config import KVEventsConfig, is_local_endpoint, kv_event_endpoint_binds
from radixserve.core.kv import kv_events as core
from radixserve.engine.kv_event_sockets import (ConnectionLimit, drain_subscriptions,
                                                make_lossless_xpub, send_counting_misses)

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, gc=False,
                       tag=True):
    pass


class MapBlockStored(msgspec.Struct, gc=False, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[None]  # one per page: no multimodal input, salt or adapter name here


class MapBlockRemoved(msgspec.Struct, gc=False, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class MapAllBlocksCleared(msgspec.Struct, gc=False, tag="AllBlocksCleared"):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The batch is positional in both formats (as in vLLM); ``events`` holds one format's
    structs."""

    ts: float
    events: list
    data_parallel_rank: int | None = None


def to_wire(event: core.KVEvent, medium: str, wire_format: str = "map") -> msgspec.Struct:
    """``event`` as ``wire_format`` ("map" or "array") encodes it."""
    is_map = wire_format == "map"
    if isinstance(event, core.BlockStored):
        if is_map:
            return MapBlockStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                                  event.block_size, event.lora_id, medium, None,
                                  [None] * len(event.block_hashes))
        return BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                           event.block_size, event.lora_id, medium)
    if isinstance(event, core.BlockRemoved):
        return (MapBlockRemoved if is_map else BlockRemoved)(event.block_hashes, medium)
    return MapAllBlocksCleared() if is_map else AllBlocksCleared()


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """Replica ``rank``'s endpoint: the tcp port plus the rank, an inproc name with a
    ``_dp<rank>`` suffix (rank 0 and ipc:// unchanged), as vLLM offsets them."""
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, port = endpoint.rsplit(":", 1)
        return f"{base}:{int(port) + rank}"
    return endpoint


class NullPublisher:
    """Events off."""

    num_dropped = 0
    num_dropped_events = 0
    num_published = 0
    num_refused_subscribers = 0
    num_subscribers_behind = 0

    def publish(self, events: list[core.KVEvent]) -> None:
        pass

    def close(self) -> None:
        pass


class ZmqPublisher:
    """XPUB socket (a PUB to subscribers) + ROUTER replay socket served by one daemon thread
    (ZMQ sockets are not thread-safe: only that thread touches them after ``__init__``)."""

    SHUTDOWN_TIMEOUT_S = 1.0

    def __init__(self, config: KVEventsConfig, medium: str) -> None:
        self.config = config
        self.medium = medium
        self.rank = config.data_parallel_rank
        self.endpoint = offset_endpoint(config.endpoint, self.rank)
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, self.rank)
        self.num_dropped = 0  # batches the full queue refused (engine thread)
        self._num_refused_events = 0  # their events (engine thread)
        self._num_unsent_events = 0  # events of batches the socket failed to send (publisher)
        self.num_subscribers_behind = 0  # reached their high-water mark (publisher thread)
        self.num_published = 0  # batches sent (publisher thread)
        self._seqs = count()  # drawn on the engine thread, in step order
        self._is_fresh = True  # the first batch announces an empty cache
        self._queue: queue.Queue[tuple[int, float, list[core.KVEvent]] | None] = queue.Queue(
            config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = zmq.Context.instance()
        self._pub = make_lossless_xpub(self._ctx, config.hwm)
        self._limits: list[ConnectionLimit] = []
        if kv_event_endpoint_binds(self.endpoint):
            self._pub.bind(self.endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)  # a port "*" chose
            self._limits.append(ConnectionLimit(self._pub, config.max_subscribers, "subscriber"))
        else:
            self._pub.connect(self.endpoint)
        self._replay = None
        if self.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.setsockopt(zmq.SNDHWM, config.hwm)
            self._replay.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full asker: Again, not a drop
            self._replay.bind(self.replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._limits.append(ConnectionLimit(self._replay, config.max_subscribers, "replay"))
        self._topic = config.topic.encode()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        for endpoint in self._listening():
            logger.warning("KV events: %s listens beyond this machine with no authentication "
                           "(allow_remote): whoever reaches it reads every prompt's token ids",
                           endpoint)
        logger.info("KV events: publishing on %s%s (topic %r, rank %d)", self.endpoint,
                    f", replay on {self.replay_endpoint}" if self._replay else "",
                    config.topic, self.rank)

    def _listening(self) -> list[str]:
        """The bound endpoints reachable from other machines (only with ``allow_remote``)."""
        bound = [self.endpoint] if self._limits and self._limits[0].what == "subscriber" else []
        bound += [self.replay_endpoint] if self._replay is not None else []
        return [e for e in bound if not is_local_endpoint(e)]

    def publish(self, events: list[core.KVEvent]) -> None:
        """Queue one batch (a step's events) under the next ``seq``; never waits: a full
        queue drops it (its ``seq`` stays unused: a gap for subscribers). The first batch
        starts with AllBlocksCleared: a new engine (one that replaces a dead one too) holds
        nothing, and subscribers that indexed its predecessor learn so."""
        if self._is_fresh:
            events, self._is_fresh = [core.AllBlocksCleared(), *events], False
        try:
            self._queue.put_nowait((next(self._seqs), time.time(), events))
        except queue.Full:
            self.num_dropped += 1
            self._num_refused_events += len(events)

    @property
    def num_dropped_events(self) -> int:
        """Events lost for every subscriber so far: refused by the full queue or not sent
        (two counters, each written by one thread; read from any)."""
        return self._num_refused_events + self._num_unsent_events

    @property
    def num_refused_subscribers(self) -> int:
        """Connections closed for being past ``max_subscribers`` (publisher thread)."""
        return sum(limit.num_refused for limit in self._limits)

    def close(self) -> None:
        """Send what is queued (for at most a second), then close the sockets."""
        try:
            self._queue.put(None, timeout=self.SHUTDOWN_TIMEOUT_S)
        except queue.Full:
            pass
        self._thread.join(self.SHUTDOWN_TIMEOUT_S)
        if not self._thread.is_alive():
            for limit in self._limits:
                limit.close()
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            for limit in self._limits:
                limit.enforce()
            drain_subscriptions(self._pub)
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, ts, events = item
            wire = [to_wire(e, self.medium, self.config.wire_format) for e in events]
            batch = KVEventBatch(ts, wire, self.rank)
            payload = encoder.encode(batch)
            self._buffer.append((seq, payload))
            try:
                if send_counting_misses(self._pub, (self._topic, seq.to_bytes(8, "big"),
                                                    payload)):
                    self.num_subscribers_behind += 1  # it sees the gap and may replay
            except zmq.ZMQError as exc:
                self._num_unsent_events += len(events)
                logger.debug("KV events batch %d not sent: %s", seq, exc)
            else:
                self.num_published += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV events: malformed replay request of %d frames", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        try:
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"),
                                                 payload), zmq.NOBLOCK)
            self._replay.send_multipart((client, b"", END_SEQ, b""), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # Again: the asker holds ``hwm`` unread; or it left
            self.num_subscribers_behind += isinstance(exc, zmq.Again)
            logger.debug("KV events: replay from %d cut short: %s", first, exc)


def make_publisher(config: KVEventsConfig, device: str) -> NullPublisher | ZmqPublisher:
    """The publisher ``config`` asks for; ``device`` names the medium ("GPU" for cuda, as
    vLLM names its device cache; "CPU" otherwise)."""
    if not config.is_enabled:
        return NullPublisher()
    return ZmqPublisher(config, "GPU" if device.startswith("cuda") else "CPU")


class KVEventsOutlet:
    """The cache's sink and the publisher together: ``flush`` (the engine, after each step)
    hands the step's events over as one batch."""

    def __init__(self, sink: core.KVEvents | None = None,
                 publisher: NullPublisher | ZmqPublisher | None = None) -> None:
        self.sink = sink or core.NoKVEvents()
        self.publisher = publisher or NullPublisher()

    def flush(self) -> None:
        events = self.sink.take()
        if events:
            self.publisher.publish(events)

    @property
    def num_dropped(self) -> int:
        return self.publisher.num_dropped

    @property
    def num_dropped_events(self) -> int:
        return self.publisher.num_dropped_events

    @property
    def num_subscribers_behind(self) -> int:
        return self.publisher.num_subscribers_behind

    @property
    def num_refused_subscribers(self) -> int:
        return self.publisher.num_refused_subscribers

    def close(self) -> None:
        self.flush()
        self.publisher.close()


RANK_ENV = "RADIXSERVE_DATA_PARALLEL_RANK"  # set in a replica's process (`with_replica_rank`)


def with_replica_rank(rank: int, build):
    """In data-parallel replica ``rank``'s process: note its rank (its KV events publish on
    the endpoint's port + rank), then build its engine."""
    import os

    os.environ[RANK_ENV] = str(rank)
    return build()
