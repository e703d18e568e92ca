"""A KV events subscriber written from vLLM's wire format alone (ZMQ SUB; msgpack batches
``[ts, events, rank]`` whose events are field-name maps tagged by ``"type"`` (vLLM since
vllm-project/vllm#42892) or tagged positional arrays (before it)) and vLLM's block-hash
formula, for the engine and server tests."""

from __future__ import annotations

import hashlib
import pickle
import time

import msgspec
import zmq

SEED = "1234"
BS = 16


class BlockStored(msgspec.Struct):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None  # maps only
    extra_keys: list | None = None  # maps only


class BlockRemoved(msgspec.Struct):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct):
    pass


class KVEventBatch(msgspec.Struct):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None
    wire_format: str = ""  # what the events were: "map", "array" ("" for none)


_TYPES = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


class BatchDecoder:
    """Either event encoding; a batch must not mix them."""

    def decode(self, payload: bytes) -> KVEventBatch:
        ts, raw, *rank = msgspec.msgpack.decode(payload)
        events, formats = [], set()
        for e in raw:
            if isinstance(e, dict):
                formats.add("map")
                cls = _TYPES[e.pop("type")]
                assert set(e) <= set(cls.__struct_fields__), e
                events.append(cls(**e))
            else:
                formats.add("array")
                events.append(_TYPES[e[0]](*e[1:]))
        assert len(formats) <= 1, formats
        return KVEventBatch(ts, events, rank[0] if rank else None,
                            formats.pop() if formats else "")


DECODER = BatchDecoder()


def vllm_hashes(token_ids: list[int], seed: str = SEED) -> list[int]:
    """vLLM's hash_block_tokens chain with sha256 (pickle), NONE_HASH = sha256(seed)."""
    def h(obj):
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    parent, out = h(seed), []
    for i in range(0, len(token_ids) // BS * BS, BS):
        parent = h((parent, tuple(token_ids[i:i + BS]), None))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


class Subscriber:
    def __init__(self, endpoint: str, topic: bytes = b""):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        time.sleep(0.3)  # ZMQ's slow joiner: the subscription must reach the PUB first

    def drain(self, quiet_s: float = 0.5) -> list[tuple[int, KVEventBatch]]:
        got = []
        while self.sub.poll(int(quiet_s * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
        return got

    def close(self):
        self.sub.close(linger=0)
        self.ctx.term()
