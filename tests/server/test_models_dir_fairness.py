"""`ModelHub` under issue 62's attacks, in-process with the fake engine start of
test_models_dir_hub: steady traffic to the loaded model must not starve another model's load
(new requests queue behind the waiting load, as Ollama's do), and ``keep_alive`` values that
cannot be a duration (nan, inf, past Go's ~292 years) are refused instead of breaking /api/ps."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from test_models_dir_hub import loaded, make_hub

from radixserve.frontend.models_dir import listing
from radixserve.frontend.models_dir.args import MAX_KEEP_ALIVE_S, parse_keep_alive


def test_steady_traffic_does_not_starve_another_models_load(tmp_path):
    """Overlapping requests keep ``a`` busy at every instant; ``b``'s load (one model at a
    time) must still get its turn well before the wait timeout."""
    async def main():
        hub, starts = make_hub(tmp_path, {"a": 64, "b": 64}, max_loaded=1, wait=3.0)
        hub.release(await hub.acquire("a"))
        stop = time.monotonic() + 2.5

        async def client(offset: float) -> list[str]:
            await asyncio.sleep(offset)
            got = []
            while time.monotonic() < stop:
                served = await hub.acquire("a")  # may queue behind b's load, then reload a
                got.append(served.entry.name)
                await asyncio.sleep(0.1)  # the request's work: two clients overlap always
                hub.release(served)
            return got

        clients = [asyncio.ensure_future(client(i * 0.05)) for i in range(2)]
        await asyncio.sleep(0.3)
        began = time.monotonic()
        b = await hub.acquire("b")
        waited = time.monotonic() - began
        assert b.entry.name == "b" and waited < 1.0, f"b waited {waited:.1f} s"
        hub.release(b)
        assert all(got for got in await asyncio.gather(*clients))
        assert starts.started[:2] == ["a", "b"] and len(starts.live) <= 1
        await hub.close()

    asyncio.run(main())


def test_a_load_that_fails_lets_the_queued_requests_through(tmp_path):
    """``b`` cannot get room (``a`` held past the wait timeout): b gets its 503, and a
    request for ``a`` that queued behind it is then served."""
    async def main():
        hub, _ = make_hub(tmp_path, {"a": 64, "b": 64}, max_loaded=1, wait=0.4)
        held = await hub.acquire("a")
        load_b = asyncio.ensure_future(hub.acquire("b"))
        await asyncio.sleep(0.1)
        queued = asyncio.ensure_future(hub.acquire("a"))
        await asyncio.sleep(0.1)
        assert not queued.done()  # not admitted while b waits for room
        with pytest.raises(Exception) as err:
            await load_b
        assert getattr(err.value, "status", None) == 503
        served = await asyncio.wait_for(queued, 1.0)
        assert served is held and loaded(hub) == ["a"]
        hub.release(served)
        hub.release(held)
        await hub.close()

    asyncio.run(main())


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "infinity", "1e308", 1e308,
                                   float("nan"), float("inf"), "999999999999h", 10 ** 400,
                                   "1e3", "9999999999s", MAX_KEEP_ALIVE_S * 2, "0x10"])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    with pytest.raises(ValueError, match="keep_alive") as err:
        parse_keep_alive(value)
    assert str(value)[:12] in str(err.value)  # the 400 names the value


@pytest.mark.parametrize("value, seconds", [("2562047h", 2562047 * 3600.0), ("+5m", 300.0),
                                            (-1e308, math.inf), ("-999999999999h", math.inf),
                                            (9_000_000_000, 9e9), ("1.5", 1.5)])
def test_keep_alive_edges_that_are_durations(value, seconds):
    assert parse_keep_alive(value) == seconds


def test_api_ps_survives_any_expiry(tmp_path):
    """/api/ps formats each model's expiry: the longest keep_alive accepted, and a slot whose
    time arithmetic overflows anyway, both give a date (never an exception)."""
    async def main():
        hub, _ = make_hub(tmp_path, {"a": 64})
        hub.release(await hub.acquire("a"), keep_alive=MAX_KEEP_ALIVE_S)
        slot = hub.slots["a"]
        info = (await listing.read_infos([slot.entry]))[0]
        assert listing.ollama_ps(slot.entry, slot, info)["expires_at"] > "2300"
        slot.keep_alive_s = 1e308  # set past the parser (e.g. an old client of the hub)
        assert listing.ollama_ps(slot.entry, slot, info)["expires_at"] == listing.FOREVER
        await hub.close()

    asyncio.run(main())
