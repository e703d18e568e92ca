"""The drain deadline: how a graceful shutdown that outlasts ``--drain-timeout`` ends the
responses still open, each in its API's own shape, instead of leaving uvicorn to cancel them
mid-chunk (no terminator for the client, a traceback per response in the log).

The `Router` registers the task serving each request; at the deadline `Drain.expire` cancels
them all. Where the cancellation lands decides the answer: in a handler (the response not
started) the route's error body with `ServerDraining`'s 503; in a stream (`send_stream`) the
route's error chunk for it, then its terminator. Either takes the cancellation back
(`Drain.took_cut`), so the request ends normally and uvicorn's own cut, a grace period later,
finds nothing left to cancel.
"""

from __future__ import annotations

import asyncio

from radixserve.frontend.http.protocol_base import OpenAIError


class ServerDraining(OpenAIError):
    """What a response still open at the drain deadline ends with."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down: its drain timeout ended this request",
                         503, "service_unavailable", code="server_shutting_down")


class Drain:
    """The tasks serving requests, cancelled together by `expire`. Not thread-safe: the
    event loop's thread only."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self.is_expired = False

    def enter(self) -> asyncio.Task:
        """Register the current task (until `leave`); returns it."""
        task = asyncio.current_task()
        self._tasks.add(task)
        return task

    def leave(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)

    def expire(self) -> None:
        """The deadline: cancel every registered task (once; later calls do nothing)."""
        if self.is_expired:
            return
        self.is_expired = True
        for task in list(self._tasks):
            task.cancel()

    def took_cut(self) -> bool:
        """Inside ``except CancelledError`` of a registered task: whether the cancellation is
        the drain's; if so it is taken back (``uncancel``), and the caller ends its response
        with `ServerDraining` instead of propagating it."""
        task = asyncio.current_task()
        if not self.is_expired or task not in self._tasks:
            return False
        task.uncancel()
        return True
