"""Limits at the edge, below the ASGI app: every connection must finish its request headers in
time, and there are only so many connections, in all and per client address.

uvicorn's own protocol bounds the idle wait between two requests on a kept-alive connection
(``timeout_keep_alive``), but nothing else before the app runs: a client that opens
connections and never finishes (or trickles) its headers holds a file descriptor each, for
ever, before any authentication (slowloris). `guarded_protocol` subclasses uvicorn's httptools
protocol with:

* a header deadline: from the connection's start, and again from the end of each response,
  the next request's headers must be complete within ``header_timeout`` seconds, however
  slowly the bytes come; past it the client gets a 408 and the connection is closed;
* a cap on open connections, in all (``max_connections``) and from one address
  (``max_per_client``): a connection beyond either gets a 503 with Retry-After at once and is
  closed, so the refusal is an answer, not a hang;
* the 400 for a request the HTTP parser rejects (a non-numeric Content-Length, say) in the
  OpenAI error shape, as JSON, instead of uvicorn's plain text.

NOTE: a connection is counted from ``connection_made`` to ``connection_lost``; refused ones are
closed right after their answer and never reach the app.
"""

from __future__ import annotations

import json
import logging
import resource
from collections import Counter
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``None`` turns a limit off."""

    header_timeout: float | None = 15.0
    keep_alive_timeout: float = 5.0
    max_connections: int | None = 4096
    max_per_client: int | None = 1024


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files towards ``wanted`` (at most the hard
    limit), so the connection cap, not EMFILE, is what refuses clients; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol under ``limits`` (the module's rules); pass it as
    ``uvicorn.Config(http=...)``. Each call makes a class with its own per-client counts."""
    per_client: Counter[str] = Counter()
    refusals = _RefusalLog()

    class GuardedProtocol(HttpToolsProtocol):
        _deadline = None  # the pending header-deadline timer, if any
        _host: str | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._host = self.client[0] if self.client else None
            per_client[self._host] += 1
            total, mine = len(self.connections), per_client[self._host]
            if limits.max_connections is not None and total > limits.max_connections:
                self._refuse(f"the server holds its maximum of {limits.max_connections} "
                             "connections; retry shortly")
            elif limits.max_per_client is not None and mine > limits.max_per_client:
                self._refuse(f"this client holds the maximum of {limits.max_per_client} "
                             "connections per address; close some and retry")
            else:
                self._arm_deadline()

        def connection_lost(self, exc) -> None:
            self._disarm_deadline()
            if self._host in per_client:
                per_client[self._host] -= 1
                if per_client[self._host] <= 0:
                    del per_client[self._host]
            self._host = "<gone>"  # counted down once
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm_deadline()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._arm_deadline()  # the next request's headers, once bytes come

        def send_400_response(self, msg: str) -> None:
            self._answer(400, "Bad Request", f"{msg.rstrip('.')}: the HTTP request could not "
                         "be parsed (malformed request line, header or Content-Length)")

        def _arm_deadline(self) -> None:
            self._disarm_deadline()
            if limits.header_timeout is not None:
                self._deadline = self.loop.call_later(limits.header_timeout, self._too_slow)

        def _disarm_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is running (pipelined bytes): its own limits apply
            self._answer(408, "Request Timeout", f"the request headers did not arrive within "
                         f"{limits.header_timeout:g} s (--header-read-timeout)")

        def _refuse(self, message: str) -> None:
            refusals.note(self.loop.time(), f"from {self._host}: {message}")
            self._answer(503, "Service Unavailable", message, [(b"retry-after", b"1")])

        def _answer(self, status: int, reason: str, message: str,
                    headers: list[tuple[bytes, bytes]] = ()) -> None:
            """An error answer in the OpenAI shape, then close the connection."""
            body = json.dumps({"error": {"message": message, "type": "invalid_request_error"
                                         if status < 500 else "server_error",
                                         "param": None, "code": status}}).encode()
            head = [f"HTTP/1.1 {status} {reason}".encode(), b"content-type: application/json",
                    b"content-length: " + str(len(body)).encode(), b"connection: close"]
            head += [name + b": " + value for name, value in headers]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.transport.close()

    return GuardedProtocol


class _RefusalLog:
    """Refused connections as WARNINGs, at most one line per ``every`` seconds (a flood of
    them must not become a flood of log lines: the log's pipe could fill and block us)."""

    every = 10.0

    def __init__(self) -> None:
        self._last = float("-inf")
        self._unlogged = 0

    def note(self, now: float, what: str) -> None:
        if now - self._last < self.every:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last report)" if self._unlogged else ""
        logger.warning("connection refused %s%s", what, more)
        self._last, self._unlogged = now, 0
