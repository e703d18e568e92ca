"""The ASGI plumbing every route shares (`router`): reading a request body, noticing the client
leave, and sending a streamed response that stops as soon as it does.

A client that leaves is the one event every path must handle the same way: the engine
requests behind the response are aborted (by cancelling the work, or closing the stream's
generator), so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from radixserve.frontend.http.drain import Drain, ServerDraining
from radixserve.frontend.http.protocol_base import ClientDisconnected

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache")]
SSE_DONE = "data: [DONE]\n\n"  # how an OpenAI stream ends


async def read_body(receive) -> bytes:
    """The whole request body; ClientDisconnected if the client leaves while sending it."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def wait_disconnect(receive) -> None:
    """Return when the client has gone (the body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive, work: Awaitable):
    """Await ``work`` unless the client disconnects first; then cancel it (which aborts the
    engine requests it started) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()  # the server stopping: the work's engine requests end with it
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise ClientDisconnected()
    return task.result()


async def send_stream(chunks: AsyncIterator[str | bytes], receive, send, headers: list,
                      error_chunk: Callable[[Exception], bytes | None], tail: bytes = b"",
                      ends: bytes | None = None, drain: Drain | None = None) -> None:
    """Send ``chunks`` as one streamed 200 response with ``headers``, closed by ``tail``.

    A chunk ending with ``ends`` closes the response itself (one write, not two). An exception
    from ``chunks`` after the response has started becomes a last chunk ``error_chunk(exc)``
    (none if it returns None), then ``tail``. As soon as the client leaves, sending stops, and
    ``chunks`` is closed on every exit (which aborts the engine requests behind it). The
    ``drain``'s cut ends the stream as an error does, with `ServerDraining`; any other
    cancellation propagates. ``chunks`` may carry its own ``error_chunk`` (a stream whose
    error event depends on what it sent: the Responses API's), used instead.
    """
    error_chunk = getattr(chunks, "error_chunk", error_chunk)
    this = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        await wait_disconnect(receive)
        gone = True
        this.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for chunk in chunks:
                body = chunk.encode() if isinstance(chunk, str) else chunk
                last = ends is not None and body.endswith(ends)
                await send({"type": "http.response.body", "body": body, "more_body": not last})
                if last:
                    return
        except ClientDisconnected:
            return  # the client left while the stream was being made
        except Exception as exc:  # noqa: BLE001 - the engine's errors (or a bug), as a chunk
            return await _send_last(send, error_chunk(exc), tail)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
    except asyncio.CancelledError:
        if gone:
            this.uncancel()
        elif drain is not None and drain.took_cut():
            await _send_last(send, error_chunk(ServerDraining()), tail)
        else:
            raise  # the server is stopping without a drain
    finally:
        watcher.cancel()
        # shielded: a response cancelled again while closing must still abort its requests
        await asyncio.shield(chunks.aclose())


async def _send_last(send, body: bytes | None, tail: bytes) -> None:
    """End a started stream: the error chunk ``body`` (if any), then ``tail``."""
    if body:
        await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": tail, "more_body": False})
