"""Admission control: how much work may wait for the engine, and for how long.

A request is *waiting* from its admission until the engine has produced each of its
sequences' first token (prefill done). The gate counts waiting sequences (prompts × n) and
their prompt tokens in the API process — exact and immediate, unlike the engine's stats, which
lag a step — and refuses what would exceed ``--max-waiting-requests`` or
``--max-waiting-tokens`` with 429 and a ``Retry-After`` estimated from how fast waiting tokens
have been draining. A request that alone exceeds a limit could never be admitted: 400.

A ticket carries the request's queue deadline (``--request-timeout`` or its ``timeout``
field): a request still waiting then is aborted in the engine and answered with an error.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from radixserve.frontend.async_llm import QueueTicket
from radixserve.frontend.http.protocol_base import OpenAIError


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_waiting_requests: int | None = 1024  # sequences (prompts × n) waiting for a first token
    max_waiting_tokens: int | None = 65_536  # their prompt tokens
    request_timeout: float | None = None  # seconds a request may wait before its first token


class Overloaded(OpenAIError):
    """429: the queue is full now; ``retry_after`` seconds is the estimated time it drains."""

    def __init__(self, message: str, retry_after: int, reason: str) -> None:
        super().__init__(message, 429, "rate_limit_error", code=reason)
        self.retry_after = retry_after
        self.reason = reason


class Ticket(QueueTicket):
    """One admitted request's share of the waiting counts; released sequence by sequence as
    they start, the rest at once by `release` (every exit path of the request calls it)."""

    __slots__ = ("gate", "num_seqs", "num_tokens", "deadline", "timeout")

    def __init__(self, gate: AdmissionGate, num_seqs: int, num_tokens: int,
                 timeout: float | None) -> None:
        self.gate, self.num_seqs, self.num_tokens = gate, num_seqs, num_tokens
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def started(self, num_prompt_tokens: int) -> None:
        if self.num_seqs == 0:
            return
        tokens = min(num_prompt_tokens, self.num_tokens)
        self.num_seqs -= 1
        self.num_tokens -= tokens
        self.gate._release(1, tokens, drained=True)

    def timed_out(self, waited: float) -> Exception:
        self.gate.metrics.on_timeout()
        return QueueTimeout(
            f"the request waited {waited:.1f} s without starting (its queue timeout is "
            f"{self.timeout:g} s: --request-timeout or the request's `timeout` field); the "
            f"server is overloaded, retry later", self.gate.retry_after())

    def release(self) -> None:
        if self.num_seqs or self.num_tokens:
            self.gate._release(self.num_seqs, self.num_tokens, drained=False)
            self.num_seqs = self.num_tokens = 0


class QueueTimeout(OpenAIError):
    """503: the request's queue deadline passed before it started."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, 503, "timeout_error", code="queue_timeout")
        self.retry_after = retry_after


class AdmissionGate:
    """Counts what waits; `admit` reserves or refuses. Not thread-safe: event loop only."""

    def __init__(self, limits: AdmissionLimits, metrics) -> None:
        self.limits = limits
        self.metrics = metrics  # an `AdmissionMetrics`
        self.num_waiting_seqs = 0
        self.num_waiting_tokens = 0
        self._drain_rate = 0.0  # waiting tokens started per second (moving average)
        self._last_drain = time.monotonic()

    def precheck(self, num_seqs: int, min_tokens: int) -> None:
        """The cheap test before tokenizing: refuse what cannot fit even with the fewest
        tokens the prompt can have (``min_tokens``, from its length)."""
        self._check(num_seqs, min_tokens)

    def admit(self, num_seqs: int, num_tokens: int, timeout: float | None = None) -> Ticket:
        """Reserve ``num_seqs`` sequences of ``num_tokens`` prompt tokens in all, or raise
        `Overloaded` (429) / OpenAIError (400). ``timeout``: the request's own queue timeout
        (None: the server's)."""
        self._check(num_seqs, num_tokens)
        self.num_waiting_seqs += num_seqs
        self.num_waiting_tokens += num_tokens
        self.metrics.on_queue(self.num_waiting_seqs, self.num_waiting_tokens)
        if timeout is None:
            timeout = self.limits.request_timeout
        return Ticket(self, num_seqs, num_tokens, timeout)

    def _check(self, num_seqs: int, num_tokens: int) -> None:
        for limit, asked, waiting, what, flag, reason in (
                (self.limits.max_waiting_requests, num_seqs, self.num_waiting_seqs,
                 "sequences (prompts × n)", "--max-waiting-requests", "too_many_waiting"),
                (self.limits.max_waiting_tokens, num_tokens, self.num_waiting_tokens,
                 "prompt tokens", "--max-waiting-tokens", "waiting_tokens")):
            if limit is None:
                continue
            if asked > limit:
                self.metrics.on_reject(reason)
                raise OpenAIError(f"this request has {asked} {what}, more than the server "
                                  f"ever queues ({flag} {limit})", param="prompt",
                                  code="request_too_large")
            if waiting + asked > limit:
                self.metrics.on_reject(reason)
                raise Overloaded(f"the server is overloaded: {waiting} {what} are waiting "
                                 f"({flag} {limit}); retry later", self.retry_after(), reason)

    def retry_after(self) -> int:
        """Seconds until what waits now has probably started (1 to 60)."""
        if self._drain_rate <= 0:
            return 1 if self.num_waiting_tokens == 0 else 5
        return max(1, min(60, math.ceil(self.num_waiting_tokens / self._drain_rate)))

    def _release(self, num_seqs: int, num_tokens: int, drained: bool) -> None:
        self.num_waiting_seqs -= num_seqs
        self.num_waiting_tokens -= num_tokens
        assert self.num_waiting_seqs >= 0 and self.num_waiting_tokens >= 0
        if drained:
            now = time.monotonic()
            elapsed = max(now - self._last_drain, 1e-3)
            self._last_drain = now
            rate = num_tokens / elapsed
            self._drain_rate = rate if self._drain_rate == 0 else (
                0.9 * self._drain_rate + 0.1 * rate)
        self.metrics.on_queue(self.num_waiting_seqs, self.num_waiting_tokens)
