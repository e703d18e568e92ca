"""A KV events subscriber written from vLLM's wire format alone (ZMQ SUB, msgpack of
array-like tagged structs) and vLLM's block-hash formula, for the engine and server tests."""

from __future__ import annotations

import hashlib
import pickle
import time

import msgspec
import zmq

SEED = "1234"
BS = 16


class BlockStored(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, array_like=True, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


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
