"""The server's limits on what one request may take (``radixserve serve`` flags)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from radixserve.frontend.http.admission import AdmissionLimits
from radixserve.frontend.http.connection_guard import ConnectionLimits


@dataclass(frozen=True, slots=True)
class ServeLimits:
    max_request_bytes: int = 32 * 1024 * 1024
    body_read_timeout: float | None = 30.0  # seconds for a whole request body to arrive
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


def add_limit_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("limits")
    d, a, c = ServeLimits(), AdmissionLimits(), ConnectionLimits()
    g.add_argument("--header-read-timeout", type=_off_or_positive, default=c.header_timeout,
                   help="seconds a connection may take to send a request's headers, from its "
                        "start or the end of its previous response (408 and closed beyond; "
                        "0: no limit)")
    g.add_argument("--keep-alive-timeout", type=_positive, default=c.keep_alive_timeout,
                   help="seconds an idle kept-alive connection stays open between requests")
    g.add_argument("--max-connections", type=_off_or_positive_int, default=c.max_connections,
                   help="open connections in all; beyond, a new one gets 503 with Retry-After "
                        "and is closed (0: no limit but the process's open-file limit)")
    g.add_argument("--max-connections-per-client", type=_off_or_positive_int,
                   default=c.max_per_client,
                   help="open connections from one client address; beyond, 503 (0: no limit; "
                        "behind a router every connection comes from its address)")
    g.add_argument("--max-request-bytes", type=_positive_int, default=d.max_request_bytes,
                   help="largest request body accepted (413 beyond; checked from "
                        "Content-Length and while reading)")
    g.add_argument("--body-read-timeout", type=_off_or_positive, default=d.body_read_timeout,
                   help="seconds a request body may take to arrive (408 beyond; 0: no limit)")
    g.add_argument("--max-waiting-requests", type=_off_or_positive_int,
                   default=a.max_waiting_requests,
                   help="sequences (prompts x n) that may wait for their first token; beyond, "
                        "429 with Retry-After (0: no limit)")
    g.add_argument("--max-waiting-tokens", type=_off_or_positive_int,
                   default=a.max_waiting_tokens,
                   help="prompt tokens that may wait to be prefilled; beyond, 429 with "
                        "Retry-After (0: no limit)")
    g.add_argument("--request-timeout", type=_off_or_positive, default=a.request_timeout,
                   help="seconds a request may wait for its first token before it is ended "
                        "with an error (a request's `timeout` field may ask for less; "
                        "default: no limit)")


def serve_limits(args: argparse.Namespace) -> ServeLimits:
    return ServeLimits(args.max_request_bytes, args.body_read_timeout, AdmissionLimits(
        args.max_waiting_requests, args.max_waiting_tokens, args.request_timeout),
        ConnectionLimits(args.header_read_timeout, args.keep_alive_timeout,
                         args.max_connections, args.max_connections_per_client))


def _positive(text: str) -> float:
    value = _off_or_positive(text)
    if value is None:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_int(text: str) -> int:
    value = _off_or_positive_int(text)
    if value is None:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _off_or_positive_int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: no limit), got {text}")
    return value or None


def _off_or_positive(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0: no limit), "
                                         f"got {text}")
    return value or None
