"""OutputBuffer: where the API process's output loop leaves one ``generate`` call's outputs.

The output loop runs once per engine step and touches every running request; the reader (the
request's response) may run far less often. So a put is a list append, the reader is woken at
most once however many outputs arrive before it runs, and it takes everything waiting in one
go — per-token work in the loop stays a few hundred nanoseconds, and the reader's work is per
wake-up, not per token.
"""

from __future__ import annotations

import asyncio


class OutputBuffer:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list = []
        self._waiter: asyncio.Future | None = None

    def put(self, item) -> None:
        """Append ``item`` (an output or an exception to raise in the reader); wake the reader
        if it is waiting. Never blocks."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list:
        """Everything put since the last take, in order; waits while there is nothing."""
        if not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items, self._items = self._items, []
        return items

    def __len__(self) -> int:
        return len(self._items)
