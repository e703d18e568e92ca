"""The engine's LoRA bookkeeping: the registry's ids, residency under ``max_loras`` (LRU among
idle adapters, re-read from the path when named again), unload refusals; KV events of an
adapter's pages carry its id and hash apart from the base's; the Python API's errors."""

from __future__ import annotations

import pytest

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_events import KVEventLog
from radixserve.core.kv.kv_manager import KVCacheManager, cache_tokens
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.engine.lora_registry import LoraNotFound, LoraRegistry
from radixserve.sampling_params import SamplingParams


class FakeRunner:
    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def add_lora(self, lora_id: int, path: str) -> None:
        if path == "bad":
            raise ValueError("does not fit")
        self.log.append(("add", lora_id))

    def remove_lora(self, lora_id: int) -> None:
        self.log.append(("remove", lora_id))


def test_registry_lru_residency_and_refusals():
    runner, busy = FakeRunner(), set()
    reg = LoraRegistry(runner, max_loras=2, in_use=lambda: busy)
    assert [reg.load(n, f"/{n}") for n in ("a", "b")] == [1, 2]
    assert reg.acquire("a") == 1  # a is now the most recent: b is the LRU one
    reg.load("c", "/c")
    assert runner.log == [("add", 1), ("add", 2), ("add", 3), ("remove", 2)]
    busy.update({1, 3})
    assert reg.acquire("b") == 2  # re-read from its path; all others busy: over the cap
    assert runner.log[-1] == ("add", 2)
    with pytest.raises(ValueError, match="used by unfinished requests"):
        reg.unload("a")
    with pytest.raises(ValueError, match="already loaded"):
        reg.load("b", "/b")
    with pytest.raises(ValueError, match="does not fit"):
        reg.load("d", "bad")
    with pytest.raises(LoraNotFound, match=r"no LoRA adapter named 'd'; loaded: \['a', 'b', 'c'\]"):
        reg.acquire("d")
    busy.clear()
    reg.unload("a")
    reg.load("a", "/a2")  # the same name again: a fresh id, never a reused one
    assert reg.entries["a"].lora_id == 5 and reg.names == ["a", "b", "c"]


def _request(rid: str, tokens: list[int], lora_id: int | None) -> Request:
    return Request(rid, tokens, SamplingParams(), frozenset(), 0, lora_id=lora_id)


def test_kv_events_and_cache_keys_by_adapter():
    pool = BlockPool(16)
    log = KVEventLog(block_size=2, seed="0")
    kv = KVCacheManager(pool, RadixCache(pool, 2, events=log), 2)
    tokens = [1, 2, 3, 4, 5]
    plain = _request("x", tokens, None)
    assert cache_tokens(plain) is plain.all_token_ids  # the base's keys: no copy
    assert cache_tokens(_request("y", tokens, 1), 2) == [(1 << 32) + 1, (1 << 32) + 2]
    for rid, lora in (("base", None), ("lora", 7)):
        r = _request(rid, tokens, lora)
        kv.match_and_lock(r)
        assert kv.allocate_slots(r, 5)
        r.num_computed_tokens = 5
        kv.free(r)
    base, lora = log.take()
    assert base.token_ids == lora.token_ids == [1, 2, 3, 4] and base.lora_id is None
    assert lora.lora_id == 7 and set(base.block_hashes).isdisjoint(lora.block_hashes)
    assert kv.cached_len(_request("y", tokens, 7)) == 4
    assert kv.cached_len(_request("z", tokens, 8)) == 0
    kv.check_integrity()
