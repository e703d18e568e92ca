"""The KV-event publisher's socket limits (issue 62 item 7), for ``ZmqPublisher``'s thread:

- ``send_counting_misses``: one batch on an XPUB in no-drop mode, so a subscriber reaching
  its high-water mark shows up as ``Again``; the batch then goes out lossy (the others still
  get it) and the caller counts a subscriber behind. libzmq then leaves that subscriber out
  of the following sends until it has read its backlog, without a sign: one count per time a
  subscriber falls behind, not per batch it misses. (A plain PUB gives no sign at all.)
- ``ConnectionLimit``: at most ``max_connections`` peers on a bound socket. It follows the
  socket's monitor events (accepted, disconnected) and shuts down the newest connections past
  the limit (``shutdown(2)`` on a duplicate of libzmq's descriptor: libzmq sees the peer
  leave and drops its queue, as if it had).

NOTE: both only ever run on the publisher thread, the one that owns the sockets.
"""

from __future__ import annotations

import logging
import os
import socket

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


def make_lossless_xpub(ctx: zmq.Context, hwm: int) -> zmq.Socket:
    """An XPUB (SUB peers cannot tell it from a PUB) that refuses a send any subscriber has
    no room for, instead of dropping it silently for that subscriber."""
    xpub = ctx.socket(zmq.XPUB)
    xpub.setsockopt(zmq.SNDHWM, hwm)
    xpub.setsockopt(zmq.LINGER, 0)
    xpub.setsockopt(zmq.XPUB_NODROP, 1)
    return xpub


def send_counting_misses(xpub: zmq.Socket, frames: tuple[bytes, ...]) -> bool:
    """Send ``frames`` to every subscriber with room; True when one has just reached its
    high-water mark (it misses this batch and, unsignalled, the next ones until it reads).
    Never waits. Raises ZMQError as ``send_multipart`` does."""
    try:
        xpub.send_multipart(frames, zmq.NOBLOCK)
        return False
    except zmq.Again:
        pass
    xpub.setsockopt(zmq.XPUB_NODROP, 0)  # the others still get it; the full ones drop it
    try:
        xpub.send_multipart(frames, zmq.NOBLOCK)
    finally:
        xpub.setsockopt(zmq.XPUB_NODROP, 1)
    return True


def drain_subscriptions(xpub: zmq.Socket, limit: int = 1000) -> None:
    """Read the (un)subscription messages an XPUB queues for its owner, so they do not pile
    up; at most ``limit`` a call."""
    for _ in range(limit):
        try:
            xpub.recv(zmq.NOBLOCK)
        except zmq.Again:
            return


class ConnectionLimit:
    """Keeps at most ``max_connections`` peers connected to the bound ``sock``;
    ``num_refused`` counts those disconnected for it. Call ``enforce`` often (each loop of
    the publisher thread); ``close`` before closing ``sock``."""

    def __init__(self, sock: zmq.Socket, max_connections: int, what: str) -> None:
        self.max_connections, self.what = max_connections, what
        self.num_refused = 0
        self._monitor = sock.get_monitor_socket(_EVENTS)
        self._sock = sock
        self._live: list[int] = []  # descriptors, oldest first
        self._kicked: set[int] = set()

    def enforce(self) -> None:
        """Read every pending monitor event, then disconnect the newest peers past the
        limit (reading them all first: a descriptor closed and reused shows as both)."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._live.append(fd)
            elif fd in self._live:
                self._live.remove(fd)
                self._kicked.discard(fd)
        served = [fd for fd in self._live if fd not in self._kicked]
        for fd in served[self.max_connections:]:
            self._kicked.add(fd)
            if _shutdown(fd):
                self.num_refused += 1
                if self.num_refused % 1000 == 1:  # a refused SUB retries every 100 ms
                    logger.warning("KV events: %d %s connection(s) past the limit of %d "
                                   "closed so far (max_subscribers in --kv-events-config)",
                                   self.num_refused, self.what, self.max_connections)

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(linger=0)


def _shutdown(fd: int) -> bool:
    """Shut the connection on descriptor ``fd`` down (libzmq still owns and closes it)."""
    try:
        dup = socket.socket(fileno=os.dup(fd))
    except OSError:  # closed meanwhile
        return False
    try:
        dup.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:  # not connected any more
        return False
    finally:
        dup.close()
