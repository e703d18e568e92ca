"""The engine-core process: EngineCore behind two ZMQ sockets.

    API process  ──PUSH ipc://…/in──▶  engine core  ──PUSH ipc://…/out──▶  API process
       AddRequest | AbortRequests | EngineStateQuery | ResetPrefixCache | Shutdown
                                                  EngineReady, then EngineCoreOutputs

The loop drains every pending input message, runs one step if any request is unfinished, and
sends one ``EngineCoreOutputs`` per step carrying all requests' new tokens plus scheduler stats.
An ``EngineStateQuery`` is answered by an ``EngineCoreOutputs`` sent right after the inputs
are drained (its ``state`` set; every other message carries None there, one byte); so are
``ResetPrefixCache``s, applied in order as they are read (``reset_prefix_cache``: one answer
each).
Idle, it blocks on the input socket (waking every second to notice an orphaned process).
A fault while stepping fails the requests it belongs to inside ``engine.step()``; one that
escapes it ends this process, and the API process starts a new one. A step that runs longer
than ``HEARTBEAT_S`` also sends an empty ``EngineCoreOutputs`` between its decoder layers that
often (`Heartbeat`, layers/layer_progress.py): progress the API process's stall watch sees.

Torch-free at import: the API process imports this module to start the process, and
`build_engine` sizes the thread pools before torch loads.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
import traceback

import msgspec
import zmq

from radixserve import startup_trace
from radixserve.image_stats import fill_image_stats
from radixserve.kvdisk.stats import fill_disk_stats
from radixserve.core.reports import EngineCoreOutput
from radixserve.cpu.threads import apply_engine_threads
from radixserve.messages import (
    AbortRequests, EngineCoreOutputs, EngineInput, EngineReady, EngineStateQuery,
    LoraAdapterCall, LoraReply, ResetPrefixCache, Shutdown)

_IDLE_POLL_MS = 1000
# the engine's idle work (EngineCore.idle: warm-ups holding the GIL for a few tenths of a second
# at a time) waits for this long without a message or a step: a client pausing a second
# between requests (benchmark loops, evaluators) no longer meets it with its next request
QUIET_S = 3.0
_SEND_TIMEOUT_MS = 1000
HEARTBEAT_S = 1.0  # a step's sign of life between its layers, at most this often


class _Orphaned(Exception):
    """The API process is gone: nobody will read our output."""


def _send(out: zmq.Socket, data: bytes, parent: int) -> None:
    """Send, retrying while the API process is alive but not reading (its queue is full)."""
    while True:
        try:
            out.send(data)
            return
        except zmq.Again:
            if os.getppid() != parent:
                raise _Orphaned() from None


def build_engine(kwargs: dict, model: str | None):
    """``radixserve serve``'s engine, built in the engine process (``kwargs``: `engine_config`'s,
    with ``threads``): say what runs (the kernel level, threads, the layers' paths) on stderr,
    and size the thread pools before torch (and its libgomp) loads."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("radixserve engine %(levelname)s: %(message)s"))
    root = logging.getLogger("radixserve")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    threads = apply_engine_threads(kwargs.get("threads"))
    import torch  # loads from here on

    startup_trace.mark("torch imported")

    from radixserve.config import engine_config
    from radixserve.engine.build import build_engine_core
    from radixserve.engine.thread_governor import ThreadGovernor
    from radixserve.models.source import ModelSource

    rank = int(os.environ.get("RADIXSERVE_DATA_PARALLEL_RANK", "0"))  # engine/kv_events.py
    config = engine_config(model, **kwargs, data_parallel_rank=rank)
    engine = build_engine_core(config, ModelSource.resolve(model),  # a bar after 1 s of load
                               show_progress=sys.stderr.isatty())
    if kwargs.get("threads") is None and threads > 1 and config.parallel.tensor_parallel_size == 1:
        engine.threads = ThreadGovernor.for_engine(threads, torch.set_num_threads)
        logging.getLogger(__name__).info(
            "threads: %d, fewer while other processes keep its CPUs busy (--threads N fixes "
            "the count)", threads)
    return engine


def engine_stats(engine):
    """The scheduler's stats with the engine's own counters: the KV events its publisher
    dropped (an engine without events, e.g. the mock, reports none)."""
    stats = engine.scheduler.stats()
    if (kv_events := getattr(engine, "kv_events", None)) is not None:
        stats.num_kv_events_dropped = kv_events.num_dropped_events
        stats.num_kv_event_subscribers_behind = kv_events.num_subscribers_behind
        stats.num_kv_event_subscribers_refused = kv_events.num_refused_subscribers
    fill_disk_stats(stats, getattr(engine.scheduler, "kv", None))
    fill_image_stats(stats, engine)
    return stats


def _reset_prefix_cache(engine, msg: ResetPrefixCache) -> bool:
    reset = getattr(engine, "reset_prefix_cache", None)  # the mock engine caches nothing
    return True if reset is None else reset(msg.reset_running_requests)


def _lora_call(engine, msg: LoraAdapterCall) -> LoraReply:
    """Load or unload an adapter; its error as a reply (the engine goes on). An adapter the
    checks let through that still fails to load fails that call alone (a 400 naming the
    error), whatever it raised: the registry records an adapter only once it is loaded."""
    from radixserve.engine.lora_registry import LoraNotFound

    if not hasattr(engine, "load_lora"):  # the mock engine
        return LoraReply("this engine does not serve LoRA adapters", 400)
    try:
        if msg.path is None:
            engine.unload_lora(msg.name)
        else:
            engine.load_lora(msg.name, msg.path)
        return LoraReply()
    except (LoraNotFound, FileNotFoundError) as exc:
        return LoraReply(str(exc), 404)
    except ValueError as exc:
        return LoraReply(str(exc), 400)
    except Exception as exc:  # noqa: BLE001 - a file's fault, not the engine's
        traceback.print_exc()
        return LoraReply(f"the LoRA adapter {msg.name!r} could not be loaded: "
                         f"{type(exc).__name__}: {exc}", 400)


def run_engine_core(build_engine, input_addr: str, output_addr: str) -> None:
    """Process entry point. ``build_engine()`` returns an object with EngineCore's interface
    (``add_request``, ``abort_requests``, ``has_unfinished_requests``, ``step``, ``state``,
    ``max_model_len``, ``vocab_size``, ``scheduler``), e.g. the real engine or the mock."""
    startup_trace.begin("engine")  # RADIXSERVE_STARTUP_PROFILE: benchmarks/startup_profile.py
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API process decides when we stop
    parent = os.getppid()
    ctx = zmq.Context()
    inp = ctx.socket(zmq.PULL)
    inp.connect(input_addr)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)  # a send blocks at most this long
    out.connect(output_addr)
    encoder = msgspec.msgpack.Encoder()
    try:
        engine = build_engine()
        startup_trace.mark("engine built")
    except Exception as exc:  # report the load failure to the parent, then exit
        out.send(encoder.encode(EngineReady(error=f"{type(exc).__name__}: {exc}")))
        traceback.print_exc()
        return
    stats = engine.scheduler.stats()
    loras = getattr(engine, "loras", None)  # the mock engine has none
    held = {} if loras is None else {name: e.path for name, e in loras.entries.items()}
    out.send(encoder.encode(EngineReady(engine.max_model_len, engine.vocab_size,
                                        stats.num_kv_blocks, engine.scheduler.kv.block_size,
                                        loras=held, takes_images=_takes_images(engine))))
    startup_trace.end()
    _freeze_start_up_heap()  # after ready: a first request waits for it, the start does not
    try:
        _loop(engine, inp, out, encoder, parent)
    except _Orphaned:
        pass
    finally:
        kv = getattr(getattr(engine, "scheduler", None), "kv", None)  # the mock engine: none
        if (close_kv := getattr(kv, "close", None)) is not None:
            close_kv()  # the disk tier (kvdisk/) saves the cached pages
        if (kv_events := getattr(engine, "kv_events", None)) is not None:
            kv_events.close()  # sends what is queued, for at most a second
        out.close(linger=1000)
        inp.close(linger=0)
        ctx.term()


def _freeze_start_up_heap() -> None:
    """Move what loading allocated (torch's and the other libraries' modules and functions, the
    model's layers: ~390,000 tracked objects with a 3B GGUF) out of the garbage collector's
    sight for the life of the process. A full collection walked all of them: 230 ms on AMD EPYC
    Zen 5 (``gc.collect()`` after loading the 3B shape), a whole decode step's time stolen from
    whichever step it fell in. Those come when enough objects have outlived two younger
    collections (a long-running server's radix tree and requests), not every step: a b16 run
    of 128 steps had none. Per-step garbage is still collected; only what lives as long as
    the engine is frozen (as vLLM's and SGLang's engine processes do). The collection before
    the freeze takes 0.09 s after a 1.5B GGUF's load (2 cores), run once ready is sent."""
    gc.collect()
    gc.freeze()


class Heartbeat:
    """Installed between the decoder layers (layers/layer_progress.py): an empty
    ``EngineCoreOutputs`` when ``HEARTBEAT_S`` have passed since this process's last message
    (``send`` is how the loop sends, so it knows when that was)."""

    def __init__(self, out: zmq.Socket, encoder, parent: int) -> None:
        self.out, self.encoder, self.parent = out, encoder, parent
        self.last = time.monotonic()
        self._empty = encoder.encode(EngineCoreOutputs([], 0.0))

    def send(self, data: bytes) -> None:
        _send(self.out, data, self.parent)
        self.last = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= HEARTBEAT_S:
            self.send(self._empty)


def _loop(engine, inp: zmq.Socket, out: zmq.Socket, encoder, parent: int) -> None:
    from radixserve.layers import layer_progress  # torch-free

    decoder = msgspec.msgpack.Decoder(EngineInput)
    heartbeat = Heartbeat(out, encoder, parent)
    layer_progress.install(heartbeat)
    quiet_since = time.monotonic()
    while True:
        busy = engine.has_unfinished_requests()
        if busy:
            quiet_since = time.monotonic()
        if inp.poll(0 if busy else _IDLE_POLL_MS):
            quiet_since = time.monotonic()
            errors, state, resets, loras = [], None, [], []
            while True:
                try:
                    msg = decoder.decode(inp.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(msg, Shutdown):
                    return
                if isinstance(msg, AbortRequests):
                    engine.abort_requests(msg.request_ids)
                    continue
                if isinstance(msg, EngineStateQuery):
                    state = msg  # answered once, after this batch of inputs is applied
                    continue
                if isinstance(msg, ResetPrefixCache):
                    resets.append(_reset_prefix_cache(engine, msg))
                    continue
                if isinstance(msg, LoraAdapterCall):
                    loras.append(_lora_call(engine, msg))
                    continue
                try:
                    engine.add_request(msg.request)
                except ValueError as exc:
                    errors.append(EngineCoreOutput(msg.request.request_id, [], "abort",
                                                   error=str(exc)))
                except Exception as exc:  # noqa: BLE001 - a bug: this request's, not ours
                    traceback.print_exc()
                    errors.append(EngineCoreOutput(
                        msg.request.request_id, [], "error",
                        error=f"queueing the request failed: {type(exc).__name__}: {exc}"))
            if (errors or state is not None or resets or loras
                    or not engine.has_unfinished_requests()):
                # report refusals, the asked-for state, resets and fresh stats (e.g. after an
                # abort) now, not after the next step
                answer = None if state is None else engine.state(state)
                heartbeat.send(encoder.encode(EngineCoreOutputs(
                    errors, time.time(), engine_stats(engine), answer, resets or None,
                    loras or None)))
        elif not busy:
            if os.getppid() != parent:
                return  # orphaned: the API process is gone
            idle = getattr(engine, "idle", None)  # (the mock engine has no warm-up)
            if idle is not None and time.monotonic() - quiet_since >= QUIET_S:
                idle()
        if engine.has_unfinished_requests():
            outputs = engine.step()
            outputs.stats = engine_stats(engine)
            heartbeat.send(encoder.encode(outputs))


def _takes_images(engine) -> bool:
    """Whether the engine attached an image encoder (the API then takes images)."""
    return getattr(getattr(engine, "images", None), "encoder", None) is not None
