"""`ModelHub`: which models of the folder are loaded, loading them on demand and unloading them.

Contract of a request: ``served = await hub.acquire(name)`` (loads the model if needed; counts
the request in flight), forward to ``served.router``, then ``hub.release(name, keep_alive)``.

Rules (docs/models-dir.md, docs/architecture.md):
- one load at a time (``_load_lock``), so the count and memory checks hold when it starts;
  a per-model lock makes a model's load and unload exclusive, so concurrent loads of one model
  start it once and an unload never races its load.
- room for a load: at most ``max_loaded`` models, and the memory estimate must fit
  (`memory.MemoryPolicy`). Victims are idle models (no request in flight), least recently used
  first, pinned ones (keep_alive < 0) last. A model with requests in flight is never evicted:
  the load waits (up to ``wait_timeout``) for one to become idle, then answers 503 (count) or
  507 (memory, with the numbers). Nothing loaded and still too big: 507 at once.
- fairness: while a load waits for room, new requests for the loaded models are not admitted
  (they queue behind that load, as Ollama's do), so steady traffic to one model cannot keep
  it busy until the other's load times out.
- idle unload: a model unused for its keep_alive (``--models-idle-unload`` unless a request
  set it) is unloaded; keep_alive 0 unloads after the request; inf pins it.
- an explicit unload waits for the model's requests in flight (up to ``drain_timeout``); what
  is still open then ends in its API's way (an error event then [DONE]; Ollama's last
  {"error"} line), and what the model held in this process is collected (`memory.reclaim`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.models_dir.catalog import Catalog, ModelEntry, NotAModel
from radixserve.frontend.models_dir.memory import MemoryPolicy, gib, reclaim
from radixserve.frontend.models_dir.served import ServedModel

logger = logging.getLogger(__name__)
_POLL_S = 0.05  # how often a waiting load looks for an idle model again


@dataclass(eq=False)
class Slot:
    """One model's record while the server runs (kept across its loads and unloads)."""

    entry: ModelEntry
    keep_alive_s: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    served: ServedModel | None = None
    state: str = "unloaded"  # unloaded | loading | loaded | unloading
    in_flight: int = 0
    last_used: float = 0.0  # time.time() of the last request's end (or the load)
    is_pinned: bool = False  # a request's keep_alive < 0: evicted only after the others

    def keep(self, keep_alive: float | None) -> None:
        """A request's keep_alive (None: leave it as it is)."""
        if keep_alive is not None:
            self.keep_alive_s, self.is_pinned = keep_alive, math.isinf(keep_alive)

    @property
    def expires_at(self) -> float | None:
        """When it unloads if unused (None: never)."""
        if math.isinf(self.keep_alive_s) or self.keep_alive_s == 0 and self.in_flight:
            return None
        return self.last_used + self.keep_alive_s


def model_not_found(name: str, available: list[str]) -> OpenAIError:
    return OpenAIError(f"The model `{name}` does not exist. Available models: "
                       f"{', '.join(available) or '(none)'}", 404, "NotFoundError", "model",
                       "model_not_found")


class ModelHub:
    """``start(entry, args, folder, estimate_bytes, on_fatal)`` starts one model and returns
    its `ServedModel` (`serve_models_dir.start_served_model`; tests pass a fake)."""

    def __init__(self, catalog: Catalog, args, folder: str, policy: MemoryPolicy,
                 start, reclaim: Callable[[], None] = reclaim) -> None:
        """``reclaim``: what gives back an unloaded model's memory (`memory.reclaim`, a
        full collection: in this small API process a few ms; tests of the rules in a large
        test process pass a cheaper one)."""
        self.catalog, self.args, self.folder, self.policy = catalog, args, folder, policy
        self.reclaim = reclaim
        self.max_loaded: int = args.max_loaded_models
        self.idle_s: float = args.models_idle_unload or math.inf  # 0: never
        self.wait_timeout: float = args.startup_timeout
        self.drain_timeout: float = args.drain_timeout
        self.start = start
        self.slots: dict[str, Slot] = {}
        self._load_lock = asyncio.Lock()
        self._num_loads = 0
        self._admitting = asyncio.Event()  # clear while a load waits for room (fairness)
        self._admitting.set()
        self._room_for: Slot | None = None  # that load's slot
        self._reaper: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.drain = None  # the front router's `Drain`, shared by every model's router

    # -- lookup ---------------------------------------------------------------------------

    def slot(self, name: str) -> Slot:
        """The model's slot; 404 naming the available models if the folder has none such.
        A loaded model's is found without reading the folder (the per-request path)."""
        slot = self.slots.get(name) or self.slots.get(name.partition(":")[0])
        if slot is not None and slot.state == "loaded":
            return slot
        entry = self.catalog.find(name)
        if entry is None:
            raise model_not_found(name, list(self.catalog.entries()))
        slot = self.slots.get(entry.name)
        busy = slot is not None and (slot.served is not None or slot.lock.locked())
        if slot is None or slot.entry != entry and not busy:  # new, or its file changed
            slot = self.slots[entry.name] = Slot(entry, self.idle_s)
        return slot

    def listing(self) -> list[tuple[ModelEntry, Slot | None]]:
        """Every model in the folder with its slot (None: never used), by name."""
        return [(e, self.slots.get(name)) for name, e in self.catalog.entries().items()]

    def loaded(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.served is not None]

    def most_recent(self) -> Slot | None:
        """The loaded model used last (what a request naming no model gets)."""
        return max(self.loaded(), key=lambda s: s.last_used, default=None)

    # -- requests -------------------------------------------------------------------------

    async def acquire(self, name: str, load: bool = True) -> ServedModel:
        """The loaded model ``name``, loading it first if needed (``load`` False: 503 when it
        is not loaded); counts one request in flight until `release`. Raises OpenAIError:
        404 unknown, 400 not a model, 503/507 no room or a failed start."""
        slot = self.slot(name)
        if not self._admitting.is_set() and slot is not self._room_for:
            await self._behind_waiting_load()
            slot = self.slot(name)
        if slot.state == "loaded":  # the fast path: no lock
            slot.in_flight += 1
            return slot.served
        if not load:
            raise OpenAIError(f"model '{slot.entry.name}' is {slot.state}: a request that "
                              "names it loads it", 503, "service_unavailable")
        try:
            await asyncio.wait_for(slot.lock.acquire(), self.wait_timeout)
        except TimeoutError:
            raise OpenAIError(f"model '{slot.entry.name}' is still loading after "
                              f"{self.wait_timeout:g} s", 503, "service_unavailable") from None
        try:
            if slot.served is None:
                await self._load(slot)
            slot.in_flight += 1
            return slot.served
        finally:
            slot.lock.release()

    async def _behind_waiting_load(self) -> None:
        """Wait until no load waits for room (it ends within its own wait timeout; this one
        is a backstop)."""
        try:
            await asyncio.wait_for(self._admitting.wait(), self.wait_timeout)
        except TimeoutError:
            raise OpenAIError(f"another model's load is still waiting for room after "
                              f"{self.wait_timeout:g} s", 503, "service_unavailable") from None

    def release(self, served: ServedModel, keep_alive: float | None = None) -> None:
        """A request on ``served`` ended; ``keep_alive`` (seconds, 0 unload now, inf pin)
        sets how long the model stays loaded after it."""
        slot = self.slots[served.entry.name]
        slot.in_flight -= 1
        slot.last_used = time.time()
        slot.keep(keep_alive)
        if slot.keep_alive_s == 0 and slot.in_flight == 0:
            self._spawn(self._unload(slot, "keep_alive 0"))
        if slot.served is not served and slot.in_flight == 0:
            # its model was unloaded under it: this was the last request holding its objects
            asyncio.get_running_loop().call_soon(self.reclaim)

    async def load(self, name: str, keep_alive: float | None = None) -> Slot:
        """Load ``name`` (if not loaded) for no request: /models/load, Ollama's empty prompt."""
        served = await self.acquire(name)
        slot = self.slots[served.entry.name]
        slot.in_flight -= 1
        slot.last_used = time.time()
        slot.keep(keep_alive)
        return slot

    async def unload(self, name: str, reason: str = "unload request") -> bool:
        """Unload ``name``; False if it was not loaded. Waits for its requests in flight (up
        to the drain timeout)."""
        return await self._unload(self.slot(name), reason)

    async def _unload(self, slot: Slot, reason: str, if_idle: bool = False) -> bool:
        """``if_idle``: only if no request came in meanwhile (idle unload, eviction)."""
        name = slot.entry.name
        async with slot.lock:
            if slot.served is None or if_idle and slot.in_flight:
                return False
            slot.state = "unloading"
            deadline = time.monotonic() + self.drain_timeout
            while slot.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(_POLL_S)
            served, slot.served = slot.served, None
            try:
                await served.close()
            finally:
                slot.state, slot.keep_alive_s, slot.is_pinned = "unloaded", self.idle_s, False
            del served  # the last reference here: `reclaim` may free it
            self.reclaim()
            _say(f"model {name} unloaded ({reason})")
            return True

    # -- loading --------------------------------------------------------------------------

    async def _load(self, slot: Slot) -> None:
        """Start ``slot``'s model (its lock held), making room first."""
        entry = slot.entry
        try:
            entry.check()  # before any eviction: a bad file costs nobody their model
        except NotAModel as exc:
            raise OpenAIError(str(exc), 400, "invalid_request_error", "model",
                              "invalid_model") from None
        slot.state = "loading"
        try:
            served = await self._start(slot)
        except BaseException as exc:
            slot.state = "unloaded"
            _say(f"model {entry.name} not loaded: {exc}")
            raise
        slot.served, slot.state, slot.last_used = served, "loaded", time.time()

    async def _start(self, slot: Slot) -> ServedModel:
        """Make room and start ``slot``'s model under the hub's load lock; failures as
        OpenAIError."""
        entry = slot.entry
        try:
            async with self._load_lock:
                need = self.policy.estimate(entry)
                await self._make_room(slot, need)
                _say(f"loading model {entry.name} from {entry.path} (estimate {gib(need)})")
                began = time.monotonic()
                self._num_loads += 1
                folder = os.path.join(self.folder, f"{_safe(entry.name)}-{self._num_loads}")
                served = await self.start(entry, self.args, folder, need,
                                          self._on_fatal(entry.name))
        except NotAModel as exc:
            raise OpenAIError(str(exc), 400, "invalid_request_error", "model",
                              "invalid_model") from None
        except RuntimeError as exc:
            raise OpenAIError(f"model '{entry.name}' failed to start: {exc}", 503,
                              "service_unavailable") from None
        if self.drain is not None:  # one drain for the whole server
            served.router.drain = self.drain
        _say(f"model {entry.name} loaded in {time.monotonic() - began:.1f} s")
        return served

    async def _make_room(self, slot: Slot, need: int) -> None:
        """Unload idle models until ``slot`` may load (count and memory), waiting for busy
        ones up to the wait timeout; OpenAIError 503/507 when there is no room. While it
        waits, new requests for other models queue (`acquire`)."""
        try:
            await self._make_room_or_wait(slot, need)
        finally:
            self._room_for = None
            self._admitting.set()

    async def _make_room_or_wait(self, slot: Slot, need: int) -> None:
        deadline = time.monotonic() + self.wait_timeout
        while True:
            others = [s for s in self.loaded() if s is not slot]
            used = sum(s.served.estimate_bytes for s in others)
            available = self.policy.available(used)
            is_full, is_short = len(others) >= self.max_loaded, need > available
            if not is_full and not is_short:
                return
            idle = [s for s in others if s.in_flight == 0 and not s.lock.locked()]
            if idle:
                victim = min(idle, key=lambda s: (s.is_pinned, s.last_used))
                why = "least recently used" if is_full else f"{gib(need)} needed"
                await self._unload(victim, f"{why}, to load {slot.entry.name}",
                                   if_idle=True)
                continue
            if is_short and (not others or time.monotonic() >= deadline):
                raise OpenAIError(
                    f"model '{slot.entry.name}' needs about {gib(need)} (weights "
                    f"{gib(slot.entry.size_bytes)} + KV pool and engine) but {gib(available)} "
                    f"is available ({len(others)} other models loaded, {gib(used)} by "
                    f"estimate)", 507, "insufficient_memory", "model", "model_too_large")
            if time.monotonic() >= deadline:
                raise OpenAIError(f"cannot load model '{slot.entry.name}': all {len(others)} "
                                  f"loaded models are busy (--max-loaded-models "
                                  f"{self.max_loaded})", 503, "service_unavailable")
            self._room_for = slot  # from now on the busy models' new requests wait
            self._admitting.clear()
            await asyncio.sleep(_POLL_S)

    def _on_fatal(self, name: str):
        def on_fatal(reason: str) -> None:  # its engines are gone for good: drop it
            logger.error("model %s: %s", name, reason)
            slot = self.slots.get(name)
            if slot is not None:
                self._spawn(self._unload(slot, f"engine failed: {reason}"))
        return on_fatal

    # -- background -----------------------------------------------------------------------

    def start_reaper(self, period_s: float = 1.0) -> None:
        """Unload idle models past their keep_alive, checked every ``period_s``."""
        async def reap() -> None:
            while True:
                await asyncio.sleep(period_s)
                now = time.time()
                for slot in self.loaded():
                    expires = slot.expires_at
                    if (slot.state == "loaded" and slot.in_flight == 0 and expires is not None
                            and now >= expires and not slot.lock.locked()):
                        await self._unload(slot, "idle", if_idle=True)

        self._reaper = asyncio.ensure_future(reap())

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop the reaper and unload every model."""
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._unload(s, "server shutdown")
                               for s in self.loaded()), return_exceptions=True)


def _say(line: str) -> None:
    print(f"radixserve: {line}", file=sys.stderr, flush=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:40]
