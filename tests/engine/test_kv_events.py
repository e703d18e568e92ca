"""KV events end to end on the embedded model: a subscriber written from vLLM's wire format
(ZMQ SUB + msgspec) checks the hashes against vLLM's formula, eviction, replay, and that a
publisher nobody reads never holds the engine up."""

from __future__ import annotations

import os
import time

import msgspec
import pytest
import zmq
from kv_event_wire import (BS, DECODER, SEED, AllBlocksCleared, BlockRemoved, BlockStored,
                           Subscriber, vllm_hashes)
from kv_event_stall import stall_publisher

from radixserve import LLM, SamplingParams
from radixserve.config import KVEventsConfig
from radixserve.core.kv.kv_events import AllBlocksCleared as CoreCleared
from radixserve.core.kv.kv_events import BlockRemoved as CoreRemoved
from radixserve.core.kv.kv_events import BlockStored as CoreStored
from radixserve.engine.core_proc import engine_stats
from radixserve.engine.kv_events import (KVEventBatch, KVEventsOutlet, ZmqPublisher,
                                         offset_endpoint, to_wire)
from radixserve.messages import EngineCoreRequest

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    old = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = SEED  # read when the engine is built
    try:
        llm = LLM(block_size=BS, num_kv_blocks=24, show_progress=False,
                  kv_events_config={"enable_kv_cache_events": True, "topic": "kv",
                                    "endpoint": "tcp://127.0.0.1:*",
                                    "replay_endpoint": "tcp://127.0.0.1:*"})
    finally:
        os.environ.pop("PYTHONHASHSEED") if old is None else os.environ.update(
            PYTHONHASHSEED=old)
    yield llm
    llm.close()


@pytest.fixture
def sub(llm):
    s = Subscriber(llm.engine.kv_events.publisher.endpoint, b"kv")
    s.drain(0.2)
    yield s
    s.close()


def stored_prefixes(batches) -> dict[int, list[int]]:
    """Every stored hash → the tokens from the sequence start through its page, rebuilt
    from the events' parents; asserts each event's hashes are vLLM's for those tokens."""
    prefixes: dict[int, list[int]] = {}
    for _, batch in batches:
        for e in batch.events:
            if not isinstance(e, BlockStored):
                continue
            assert e.block_size == BS and len(e.token_ids) == BS * len(e.block_hashes)
            assert e.medium == "CPU" and e.lora_id is None
            tokens = ([] if e.parent_block_hash is None else prefixes[e.parent_block_hash]) \
                + e.token_ids
            assert vllm_hashes(tokens)[-len(e.block_hashes):] == e.block_hashes
            for i, h in enumerate(e.block_hashes):
                prefixes[h] = tokens[:len(tokens) - (len(e.block_hashes) - 1 - i) * BS]
    return prefixes


def test_shared_prefix_events_chain_with_vllm_hashes(llm, sub):
    shared = list(range(100, 100 + 3 * BS))
    a, b = shared + [7] * 20, shared + [9] * 20
    llm.generate([a], GREEDY)
    llm.generate([b], GREEDY)
    batches = sub.drain()
    assert [seq for seq, _ in batches] == sorted(seq for seq, _ in batches)
    assert all(batch.data_parallel_rank == 0 for _, batch in batches)
    assert {batch.wire_format for _, batch in batches} == {"map"}  # the default
    prefixes = stored_prefixes(batches)
    stored = [e for _, batch in batches for e in batch.events if isinstance(e, BlockStored)]
    assert stored[0].parent_block_hash is None
    assert stored[0].block_hashes[:3] == vllm_hashes(shared)  # the prompt's full pages first
    # b's first new page hangs off the shared prefix's last page: only its own pages stored
    first_b = next(e for e in stored if e.token_ids[:BS] == b[3 * BS:4 * BS])
    assert first_b.parent_block_hash == vllm_hashes(shared)[-1]
    assert prefixes[first_b.block_hashes[0]] == b[:4 * BS]
    assert sum(e.block_hashes.count(h) for e in stored for h in vllm_hashes(shared)) == 3


def test_tiny_pool_evicts_and_reports_removed(llm, sub):
    assert llm.engine.scheduler.kv.prefix_cache.reset()  # start empty: AllBlocksCleared
    prompts = [[1000 + 50 * i + t for t in range(5 * BS)] for i in range(6)]  # 6 x 5 pages
    for p in prompts:
        llm.generate([p], GREEDY)
    batches = sub.drain()
    assert isinstance(batches[0][1].events[0], AllBlocksCleared)
    stored = stored_prefixes(batches)
    removed = [h for _, batch in batches for e in batch.events if isinstance(e, BlockRemoved)
               for h in e.block_hashes]
    assert removed, "a 24-block pool holding 30 pages of prompts must evict"
    assert set(removed) <= set(stored)  # only what was stored is removed
    assert set(vllm_hashes(prompts[0])) <= set(removed)  # the oldest went first


def test_replay_returns_missed_batches(llm, sub):
    llm.generate([list(range(2000, 2000 + 2 * BS + 3))], GREEDY)
    live = sub.drain()
    assert live
    first = live[0][0]
    dealer = sub.ctx.socket(zmq.DEALER)
    dealer.connect(llm.engine.kv_events.publisher.replay_endpoint)
    dealer.send_multipart([b"", first.to_bytes(8, "big")])
    replayed = []
    while True:
        assert dealer.poll(5000), "no replay answer"
        _, seq, payload = dealer.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            assert payload == b""
            break
        replayed.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    dealer.close(linger=0)
    assert replayed == live


def test_endpoint_offsets_per_replica():
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://10.0.0.1:6000", 1) == "tcp://10.0.0.1:6001"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    assert offset_endpoint(None, 2) is None


def test_config_parse_like_vllm():
    assert not KVEventsConfig.parse(None).is_enabled
    assert KVEventsConfig.parse('{"enable_kv_cache_events": true}').publisher == "zmq"
    assert not KVEventsConfig.parse('{"publisher": "zmq"}').is_enabled
    with pytest.raises(ValueError, match="unknown"):
        KVEventsConfig.parse('{"endpont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="publisher"):
        KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "kafka"}')


def test_unreachable_or_stuck_endpoint_never_blocks():
    """A PUB connecting to nowhere, and a tiny queue whose thread cannot keep up: publish
    never waits, the extra batches are dropped and counted."""
    config = KVEventsConfig(True, "zmq", "tcp://192.0.2.1:5557", max_queue_size=2, hwm=1)
    pub = ZmqPublisher(config, "CPU")
    batch = [CoreStored([1, 2], None, list(range(2 * BS)), BS)]
    start = time.perf_counter()
    for _ in range(20_000):
        pub.publish(batch)
    elapsed = time.perf_counter() - start
    pub.close()
    assert elapsed < 1.0, f"20k publishes took {elapsed:.2f} s"
    assert pub.num_dropped > 0 and pub.num_dropped + pub.num_published <= 20_000


def test_engine_steps_unslowed_by_a_subscriber_that_never_reads():
    """A connected SUB that never reads (HWM 1 both sides): the same work takes about as long
    as with events off (best of two runs each, the prefix cache emptied before each)."""
    llm = LLM(block_size=BS, num_kv_blocks=64, show_progress=False,
              kv_events_config={"enable_kv_cache_events": True, "hwm": 1,
                                "endpoint": "tcp://127.0.0.1:*"})
    ctx = zmq.Context()
    stuck = ctx.socket(zmq.SUB)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(llm.engine.kv_events.publisher.endpoint)
    prompts = [[3000 + 40 * i + t for t in range(3 * BS)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm.generate(prompts, params)  # warm up these batch shapes
    outlet, seconds = llm.engine.kv_events, {"on": [], "off": []}
    for mode in ("on", "off", "on", "off"):
        assert llm.engine.scheduler.kv.prefix_cache.reset()
        outlet.sink.take()
        llm.engine.kv_events = outlet if mode == "on" else KVEventsOutlet()
        start = time.perf_counter()
        llm.generate(prompts, params)
        seconds[mode].append(time.perf_counter() - start)
    assert outlet.publisher.num_published > 0
    llm.engine.kv_events = outlet
    llm.close()
    stuck.close(linger=0)
    ctx.term()
    assert min(seconds["on"]) < 1.5 * min(seconds["off"]) + 0.1, seconds


def test_a_publisher_that_cannot_keep_up_drops_and_counts_while_generation_goes_on():
    """Queue of 2, publisher thread stuck: every request still gets all its tokens; the
    batches past the queue are dropped, counted in the engine's stats, and leave a gap in
    ``seq`` that a subscriber sees once the thread runs again."""
    llm = LLM(block_size=BS, num_kv_blocks=64, show_progress=False,
              kv_events_config={"enable_kv_cache_events": True, "max_queue_size": 2,
                                "endpoint": "tcp://127.0.0.1:*"})
    pub = stall_publisher(llm.engine)
    sub = Subscriber(pub.endpoint)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    try:
        for i in range(4):  # each stores its prompt's 3 pages: a batch at least
            out = llm.generate([[4000 + 40 * i + t for t in range(3 * BS)]], params)
            assert len(out[0].outputs[0].token_ids) == 12
        assert pub.num_dropped >= 2 and pub.num_dropped_events >= pub.num_dropped
        assert engine_stats(llm.engine).num_kv_events_dropped == pub.num_dropped_events
        pub.release.set()
        llm.generate([[5000 + t for t in range(2 * BS)]], params)  # one more batch
        seqs = [seq for seq, _ in sub.drain()]
    finally:
        sub.close()
        llm.close()
    assert seqs[:2] == [0, 1]  # the two the queue held
    assert seqs[2] - seqs[1] - 1 == pub.num_dropped  # the dropped ones: a gap


def test_reset_refused_while_running_then_preempting_publishes_cleared_at_once(llm, sub):
    """vLLM's reset_prefix_cache: a running request locks its cached prompt pages, so a plain
    reset changes nothing; with reset_running_requests it is preempted, the cache cleared
    (AllBlocksCleared published without waiting for a step) and the request still finishes."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request(EngineCoreRequest(request_id="reset-me", sampling_params=params,
                                         prompt_token_ids=list(range(6000, 6000 + 3 * BS))))
    tokens = [t for out in engine.step().outputs for t in out.new_token_ids]  # the prefill
    sub.drain(0.3)
    cached = engine.scheduler.kv.prefix_cache.num_cached_blocks
    assert cached >= 3
    assert not engine.reset_prefix_cache()
    assert engine.scheduler.kv.prefix_cache.num_cached_blocks == cached
    assert engine.reset_prefix_cache(reset_running_requests=True)
    events = [e for _, batch in sub.drain(0.3) for e in batch.events]
    assert events and isinstance(events[-1], AllBlocksCleared)
    assert engine.scheduler.kv.prefix_cache.num_cached_blocks == 0
    finish = None
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            tokens += out.new_token_ids
            finish = out.finish_reason or finish
    assert len(tokens) == 8 and finish == "length"
    engine.scheduler.check_integrity()


def test_wire_formats_map_by_default_array_on_request():
    """vLLM's maps since #42892 (what vllm-router reads), or its older positional arrays."""
    events = [CoreStored([7, 8], None, list(range(2 * BS)), BS), CoreRemoved([7]),
              CoreCleared()]
    assert KVEventsConfig.parse('{"enable_kv_cache_events": true}').wire_format == "map"
    with pytest.raises(ValueError, match="wire_format"):
        KVEventsConfig.parse('{"enable_kv_cache_events": true, "wire_format": "json"}')
    encode = msgspec.msgpack.Encoder().encode
    as_map = encode(KVEventBatch(1.5, [to_wire(e, "CPU") for e in events], 0))
    raw = msgspec.msgpack.decode(as_map)[1][0]
    assert raw == {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
                   "token_ids": list(range(2 * BS)), "block_size": BS, "lora_id": None,
                   "medium": "CPU", "lora_name": None, "extra_keys": [None, None]}
    as_array = encode(KVEventBatch(1.5, [to_wire(e, "CPU", "array") for e in events], 0))
    assert msgspec.msgpack.decode(as_array)[1][2] == ["AllBlocksCleared"]
    for payload, fmt in ((as_map, "map"), (as_array, "array")):
        batch = DECODER.decode(payload)
        assert batch.wire_format == fmt and batch.data_parallel_rank == 0
        assert isinstance(batch.events[0], BlockStored) and batch.events[1].block_hashes == [7]
        assert batch.events[2] == AllBlocksCleared()


def test_a_new_publishers_first_batch_announces_an_empty_cache():
    """An engine that replaces a dead one starts empty: its first batch says so before its
    first stores, so a router drops what it indexed of the old process."""
    pub = ZmqPublisher(KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*"), "CPU")
    sub = Subscriber(pub.endpoint)
    stored = CoreStored([1], None, list(range(BS)), BS)
    pub.publish([stored])
    pub.publish([stored])
    got = [batch.events for _, batch in sub.drain()]
    pub.close()
    sub.close()
    assert [[type(e).__name__ for e in events] for events in got] == [
        ["AllBlocksCleared", "BlockStored"], ["BlockStored"]]
