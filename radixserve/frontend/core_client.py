"""The API process's side of the engine-core connection (asyncio + ZMQ).

One background task reads ``EngineCoreOutputs`` (one message per engine step) and routes each
request's output to the ``OutputBuffer`` registered for it. If the engine dies, every pending
queue receives an ``EngineDeadError`` so no request hangs; ``rebind`` then readies the client
for a replacement engine process (the API process's `EngineSupervisor` drives that). The
messages' arrival times feed a `ProgressWatch`, from which ``stalled`` tells a hung engine
(alive, but silent with requests in flight) for the supervisor to replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from radixserve.core.reports import EngineState, SchedulerStats
from radixserve.messages import (
    AbortRequests,
    AddRequest,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineReady,
    EngineStateQuery,
    LoraAdapterCall,
    LoraReply,
    ResetPrefixCache,
    Shutdown,
)
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.frontend.progress_watch import ProgressWatch

_MAX_DRAIN = 256  # messages read per wake-up of the output loop
STATE_FRESH_S = 0.25  # an EngineState this young is reused: at most 4 queries a second


class EngineDeadError(RuntimeError):
    pass


class EngineCoreClient:
    def __init__(self, input_addr: str, output_addr: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self.queues: dict[str, OutputBuffer] = {}  # request id -> where its outputs go
        self.stats = SchedulerStats()
        self.ready: EngineReady | None = None
        self.dead: str | None = None
        self.last_output_time = time.time()
        self.progress = ProgressWatch(time.monotonic())
        self._task: asyncio.Task | None = None
        self._state_waiter: asyncio.Future | None = None  # the EngineStateQuery in flight
        self._last_state: tuple[float, EngineState] | None = None
        self._state_asked = 0.0
        self._reset_waiters: deque[asyncio.Future] = deque()  # ResetPrefixCache, in order
        self._lora_waiters: deque[asyncio.Future] = deque()  # LoraAdapterCall, in order
        self._bind(input_addr, output_addr)

    def _bind(self, input_addr: str, output_addr: str) -> None:
        """Bind both sockets; ``input_addr`` / ``output_addr`` become the addresses bound, which
        the engine connects to (``tcp://host:*`` picks a free port: the address names it)."""
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.bind(input_addr)
        # the same socket through the blocking API: a send that fits the queue is done at once
        # (no future per message); only a full queue falls back to awaiting
        self._push_now = zmq.Socket.shadow(self.push.underlying)
        self._waiting_sends = 0
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(output_addr)
        self.input_addr = self.push.getsockopt_string(zmq.LAST_ENDPOINT)
        self.output_addr = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)

    def rebind(self, input_addr: str, output_addr: str) -> None:
        """After ``mark_dead``: drop the dead engine's sockets (and whatever it left queued in
        them) and bind fresh ones for its replacement, which connects to the new addresses.
        ``dead`` stays set until ``start()``."""
        assert self.dead is not None, "rebind() replaces a dead engine only"
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.push.close(linger=0)
        self.pull.close(linger=0)
        self.ready = None
        self._bind(input_addr, output_addr)

    async def wait_ready(self, is_alive, timeout: float) -> EngineReady:
        """Wait for the engine's EngineReady; RuntimeError if it fails, dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.pull.poll(200):
                ready = msgspec.msgpack.decode(await self.pull.recv(), type=EngineReady)
                if ready.error:
                    raise RuntimeError(f"the engine failed to start: {ready.error}")
                self.ready = ready
                return ready
            if not is_alive():
                raise RuntimeError("the engine process exited during start-up")
        raise RuntimeError(f"the engine did not start within {timeout:.0f} s")

    def start(self) -> None:
        """Route the ready engine's outputs from now on: it takes requests."""
        self.stats = SchedulerStats(num_kv_blocks=self.ready.num_kv_blocks)
        self.dead = None
        self.progress.reset(time.monotonic())
        self._task = asyncio.get_running_loop().create_task(self._output_loop())

    @property
    def num_in_flight(self) -> int:
        """Requests sent and not finished or aborted."""
        return len(self.queues)

    async def add_request(self, request: EngineCoreRequest, queue: OutputBuffer) -> int:
        """Send ``request`` to the engine, its outputs to ``queue``; the engine's index among
        data-parallel replicas (0: this client is one engine)."""
        if self.dead:
            raise EngineDeadError(self.dead)
        data = self.encoder.encode(AddRequest(request))  # before registering: it may raise
        self.progress.work_arrived(time.monotonic(), was_idle=not self.queues)
        self.queues[request.request_id] = queue
        await self._send(data)
        return 0

    async def abort(self, request_ids: list[str]) -> None:
        ids = [rid for rid in request_ids if self.queues.pop(rid, None) is not None]
        if ids and not self.dead and not self.push.closed:  # closed: shut down already
            await self._send(self.encoder.encode(AbortRequests(ids)))

    async def engine_state(self, timeout: float = 5.0,
                           fresh_for: float = STATE_FRESH_S) -> EngineState:
        """The engine's `EngineState`, asked for on demand. Bounded cost whatever the number of
        pollers: an answer younger than ``fresh_for`` seconds is reused, and callers that
        come while a query is in flight share its answer. EngineDeadError when the engine is
        gone; TimeoutError when it does not answer within ``timeout`` (a long step)."""
        if self.dead:
            raise EngineDeadError(self.dead)
        if self._last_state is not None and time.monotonic() - self._last_state[0] < fresh_for:
            return self._last_state[1]
        waiter = self._state_waiter
        if waiter is None or waiter.done() or time.monotonic() - self._state_asked > timeout:
            self._state_waiter = asyncio.get_running_loop().create_future()
            self._state_asked = time.monotonic()
            await self._send(self.encoder.encode(EngineStateQuery()))
        return await asyncio.wait_for(asyncio.shield(self._state_waiter), timeout)

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 timeout: float = 30.0) -> bool:
        """Ask the engine to drop its cached pages (`ResetPrefixCache`); whether it did.
        EngineDeadError when the engine is gone or dies before answering; TimeoutError
        when it does not answer within ``timeout`` (the reset may still happen)."""
        if self.dead:
            raise EngineDeadError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self._reset_waiters.append(waiter)
        await self._send(self.encoder.encode(ResetPrefixCache(reset_running_requests)))
        return await asyncio.wait_for(waiter, timeout)

    async def lora_call(self, name: str, path: str | None, timeout: float = 120.0) -> LoraReply:
        """Load (``path``) or unload (None) a LoRA adapter in the engine; its `LoraReply`.
        EngineDeadError / TimeoutError as for ``reset_prefix_cache``."""
        if self.dead:
            raise EngineDeadError(self.dead)
        waiter = asyncio.get_running_loop().create_future()
        self._lora_waiters.append(waiter)
        await self._send(self.encoder.encode(LoraAdapterCall(name, path)))
        return await asyncio.wait_for(waiter, timeout)

    def send_lora_calls(self, calls: list[tuple[str, str | None]]) -> list[asyncio.Future]:
        """Before ``start()``: send a `LoraAdapterCall` per (name, path or None) at once, so a
        replacement engine reads them ahead of any request (nothing else can be sent before
        ``start()``: ``dead`` is still set); the futures of their `LoraReply`s, in order,
        resolved once ``start()``'s output loop reads them (EngineDeadError if it dies).
        RuntimeError when the engine does not take them (its input is not connected)."""
        assert self._task is None, "send_lora_calls() comes before start()"
        loop = asyncio.get_running_loop()
        futures = []
        for name, path in calls:
            try:  # connected (it answered EngineReady) and empty: a few messages fit at once
                self._push_now.send(self.encoder.encode(LoraAdapterCall(name, path)),
                                    zmq.NOBLOCK)
            except zmq.Again:
                raise RuntimeError("the engine did not take its LoRA adapters") from None
            futures.append(loop.create_future())
        self._lora_waiters.extend(futures)  # only now: a failed start leaves no stale waiter
        return futures

    async def _send(self, data: bytes) -> None:
        """Send in order: at once when the queue has room and no earlier send is waiting."""
        if not self._waiting_sends:
            try:
                self._push_now.send(data, zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
        self._waiting_sends += 1
        try:
            await self.push.send(data)
        finally:
            self._waiting_sends -= 1

    def stalled(self, timeout_s: float) -> str | None:
        """Why the engine counts as hung: requests in flight and no message from it for
        longer than ``self.progress.limit(timeout_s)``. None while it is up and idle or
        progressing, or when its messages wait unread here (this process is behind, not it)."""
        num_in_flight = len(self.queues)
        if self.dead or not num_in_flight or self.pull.get(zmq.EVENTS) & zmq.POLLIN:
            return None
        now = time.monotonic()
        silent, limit = self.progress.silent_for(now), self.progress.limit(timeout_s, now)
        if silent <= limit:
            return None
        requests = "request" if num_in_flight == 1 else "requests"
        return (f"the engine has made no progress for {silent:.0f} s with {num_in_flight} "
                f"{requests} in flight (stall limit {limit:.1f} s)")

    def mark_dead(self, reason: str) -> None:
        """The engine is gone: fail every pending request (their engine state went with it,
        so the stats start from zero too)."""
        self.dead = reason
        for queue in self.queues.values():
            queue.put(EngineDeadError(reason))
        self.queues.clear()
        self.stats = SchedulerStats(num_kv_blocks=self.stats.num_kv_blocks)
        self._last_state = None
        if self._state_waiter is not None and not self._state_waiter.done():
            self._state_waiter.set_exception(EngineDeadError(reason))
            self._state_waiter.exception()  # retrieved: no warning when nobody awaits it
        while self._reset_waiters or self._lora_waiters:
            waiter = (self._reset_waiters or self._lora_waiters).popleft()
            if not waiter.done():
                waiter.set_exception(EngineDeadError(reason))
                waiter.exception()

    async def shutdown(self, is_alive: Callable[[], bool] | None = None,
                       timeout: float = 10.0) -> None:
        """Tell the engine to stop, then close the sockets. With ``is_alive``, keep reading
        its outputs until it has exited (at most ``timeout`` s): an engine blocked sending to
        a full output queue would otherwise never read the Shutdown."""
        if not self.dead:
            await self.push.send(self.encoder.encode(Shutdown()))
            deadline = time.monotonic() + timeout
            while is_alive is not None and is_alive() and time.monotonic() < deadline:
                if self._task is not None and not self._task.done():
                    await asyncio.sleep(0.02)  # the output loop is reading
                elif await self.pull.poll(20):
                    await self.pull.recv()
        if self._task:
            self._task.cancel()
        self.close_sockets(linger_ms=500)

    def close_sockets(self, linger_ms: int = 0) -> None:
        """Close both sockets and the context, with no message to the engine (``shutdown``
        sends its Shutdown first). A client dropped without this leaves its context to the
        garbage collector, whose term() can block the process."""
        self.push.close(linger=linger_ms)
        self.pull.close(linger=0)
        self.ctx.term()

    async def _output_loop(self) -> None:
        # After each awaited message, whatever else is already queued is read through a
        # blocking-API shadow of the same socket without waiting (no future per message: a
        # fast engine sends thousands of step messages a second).
        drain = zmq.Socket.shadow(self.pull.underlying)
        while True:
            messages = [await self.pull.recv()]
            with contextlib.suppress(zmq.Again):
                while len(messages) < _MAX_DRAIN:
                    messages.append(drain.recv(zmq.NOBLOCK))
            for raw in messages:
                self._route(self.decoder.decode(raw))
            # recv() hands back an already-done future while messages are queued, so without
            # this the loop never yields and a fast engine starves every HTTP handler.
            await asyncio.sleep(0)

    def _route(self, outputs: EngineCoreOutputs) -> None:
        """Hand each request's output to its buffer (a request aborted meanwhile has none)."""
        self.last_output_time = time.time()
        self.progress.output_arrived(time.monotonic(), was_busy=bool(self.queues))
        if outputs.stats is not None:
            self.stats = outputs.stats
        if outputs.state is not None:
            self._last_state = (time.monotonic(), outputs.state)
            if self._state_waiter is not None and not self._state_waiter.done():
                self._state_waiter.set_result(outputs.state)
        for done in outputs.reset_prefix_cache or ():
            # one answer per ResetPrefixCache sent, in order (a waiter timed out is skipped)
            waiter = self._reset_waiters.popleft() if self._reset_waiters else None
            if waiter is not None and not waiter.done():
                waiter.set_result(done)
        for reply in outputs.lora_replies or ():
            waiter = self._lora_waiters.popleft() if self._lora_waiters else None
            if waiter is not None and not waiter.done():
                waiter.set_result(reply)
        queues = self.queues
        for out in outputs.outputs:
            queue = queues.get(out.request_id)
            if queue is None:
                continue
            queue.put(out)
            if out.finish_reason is not None:
                del queues[out.request_id]
