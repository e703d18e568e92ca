"""`ModelHub` in-process with a fake engine start (no processes): loads happen once under
concurrency, LRU eviction spares busy models, the memory estimate evicts or refuses, keep_alive
and idle unload, and the keep_alive parser."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.models_dir.args import parse_keep_alive
from radixserve.frontend.models_dir.catalog import Catalog
from radixserve.frontend.models_dir.hub import ModelHub
from radixserve.frontend.models_dir.memory import ENGINE_OVERHEAD_BYTES, MemoryPolicy
from radixserve.frontend.models_dir.served import ServedModel

MIB = 1 << 20


class FakeStarts:
    """Stands in for `start_served_model`: records starts and closes, no process."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self.started: list[str] = []
        self.closed: list[str] = []
        self.live: set[str] = set()
        self.num_reclaims = 0  # the hub's reclaim calls (one per unload)

    def reclaim(self) -> None:
        self.num_reclaims += 1

    async def __call__(self, entry, args, folder, estimate, on_fatal):
        await asyncio.sleep(self.delay)
        assert entry.name not in self.live, f"{entry.name} started twice"
        self.started.append(entry.name)
        self.live.add(entry.name)
        starts = self

        class Supervisor:
            supervisors = ()  # no engine clients whose requests close() must fail

            async def close(self, timeout=10.0):
                await asyncio.sleep(starts.delay)
                starts.live.discard(entry.name)
                starts.closed.append(entry.name)

        return ServedModel(entry, Supervisor(), SimpleNamespace(max_model_len=64), None,
                           SimpleNamespace(drain=None), estimate)


def make_hub(tmp_path, sizes: dict[str, int], max_loaded=3, idle=0.0, budget=None,
             wait=2.0) -> tuple[ModelHub, FakeStarts]:
    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    for name, size in sizes.items():
        (folder / f"{name}.gguf").write_bytes(b"GGUF" + bytes(size - 4))
    (folder / "junk.gguf").write_bytes(b"PK\x03\x04 a zip file")
    args = SimpleNamespace(max_loaded_models=max_loaded, models_idle_unload=idle,
                           startup_timeout=wait, drain_timeout=1.0)
    starts = FakeStarts()
    # no full collection per unload: this test process's heap (the whole suite's) takes ~1 s
    # to collect, which the timing rules here would read as a slow hub; the real reclaim is
    # tested in a server of its own (test_models_dir_unload.py)
    hub = ModelHub(Catalog(str(folder)), args, str(tmp_path), MemoryPolicy(0, 1, budget),
                   starts, reclaim=starts.reclaim)
    return hub, starts


def loaded(hub: ModelHub) -> list[str]:
    return sorted(s.entry.name for s in hub.loaded())


def test_concurrent_loads_and_unloads_of_one_model(tmp_path):
    async def main():
        hub, starts = make_hub(tmp_path, {"a": 64})
        served = await asyncio.gather(*(hub.acquire("a") for _ in range(8)))
        assert len({id(s) for s in served}) == 1 and starts.started == ["a"]
        for s in served:
            hub.release(s)
        # loads and unloads interleaved: never two engines, and the end state is consistent
        ops = [hub.unload("a") if i % 2 else hub.load("a") for i in range(12)]
        await asyncio.gather(*ops)
        assert len(starts.live) <= 1 and hub.slots["a"].in_flight == 0
        assert (hub.slots["a"].state == "loaded") == ("a" in starts.live)
        await hub.close()
        assert starts.live == set() and hub.slots["a"].state == "unloaded"

    asyncio.run(main())


def test_lru_eviction_spares_busy_models(tmp_path):
    async def main():
        hub, starts = make_hub(tmp_path, {"a": 64, "b": 64, "c": 64}, max_loaded=2, wait=0.3)
        a = await hub.acquire("a")
        hub.release(await hub.acquire("b"))
        hub.release(a)
        hub.release(await hub.acquire("a"))  # a used last: b is the LRU one
        hub.release(await hub.acquire("c"))
        assert loaded(hub) == ["a", "c"] and starts.closed == ["b"]
        busy = [await hub.acquire("a"), await hub.acquire("c")]
        with pytest.raises(OpenAIError) as err:  # both busy: nothing to evict
            await hub.acquire("b")
        assert err.value.status == 503 and "busy" in err.value.message
        hub.release(busy[1])  # c idle now: b may load in its place
        hub.release(await hub.acquire("b"))
        assert loaded(hub) == ["a", "b"]
        hub.release(busy[0])
        await hub.close()

    asyncio.run(main())


def test_a_pinned_model_is_evicted_last(tmp_path):
    async def main():
        hub, _ = make_hub(tmp_path, {"a": 64, "b": 64, "c": 64}, max_loaded=2)
        hub.release(await hub.acquire("a"), keep_alive=math.inf)
        hub.release(await hub.acquire("b"))
        hub.release(await hub.acquire("c"))  # a is older, but pinned: b goes
        assert loaded(hub) == ["a", "c"]
        await hub.close()

    asyncio.run(main())


def test_memory_estimate_evicts_then_refuses(tmp_path):
    async def main():
        each = ENGINE_OVERHEAD_BYTES + 4 * MIB
        hub, starts = make_hub(tmp_path, {"a": 4 * MIB, "b": 4 * MIB},
                               budget=each + each // 2)
        hub.release(await hub.acquire("a"))
        hub.release(await hub.acquire("b"))  # both do not fit: a is unloaded first
        assert loaded(hub) == ["b"] and starts.closed == ["a"]
        await hub.close()
        small, _ = make_hub(tmp_path, {"a": 4 * MIB}, budget=each // 2)
        with pytest.raises(OpenAIError) as err:
            await small.acquire("a")
        assert err.value.status == 507 and "GiB" in err.value.message
        assert small.slots["a"].state == "unloaded"

    asyncio.run(main())


def test_unknown_and_not_a_model(tmp_path):
    async def main():
        hub, starts = make_hub(tmp_path, {"a": 64})
        with pytest.raises(OpenAIError) as err:
            await hub.acquire("zzz")
        assert err.value.status == 404 and "a, junk" in err.value.message
        hub.release(await hub.acquire("a:latest"))  # Ollama's tag names the same model
        with pytest.raises(OpenAIError) as err:
            await hub.acquire("junk")
        assert err.value.status == 400 and "not a GGUF file" in err.value.message
        assert loaded(hub) == ["a"] and starts.started == ["a"]  # nobody evicted for it
        await hub.close()

    asyncio.run(main())


def test_keep_alive_and_idle_unload(tmp_path):
    async def main():
        hub, starts = make_hub(tmp_path, {"a": 64, "b": 64, "c": 64}, idle=0.2)
        hub.start_reaper(period_s=0.05)
        hub.release(await hub.acquire("a"), keep_alive=math.inf)
        hub.release(await hub.acquire("b"))
        hub.release(await hub.acquire("c"), keep_alive=0)
        await asyncio.sleep(0.1)
        assert loaded(hub) == ["a", "b"]  # c went at once
        await asyncio.sleep(0.4)
        assert loaded(hub) == ["a"]  # b idle past 0.2 s; a pinned
        assert starts.num_reclaims == 2  # each unload gives its memory back (c, b)
        await hub.close()
        assert starts.live == set()

    asyncio.run(main())


@pytest.mark.parametrize("value, seconds", [(None, None), (0, 0.0), ("0", 0.0), (-1, math.inf),
                                            ("-1", math.inf), ("-1s", math.inf), (30, 30.0),
                                            ("5m", 300.0), ("1h30m", 5400.0), ("2.5s", 2.5),
                                            ("500ms", 0.5)])
def test_parse_keep_alive(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5x", True, [1], "m5"])
def test_parse_keep_alive_refuses(value):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)
