"""KV cache events: what the prefix cache stored and dropped, for routers that index the KV
of several workers (llm-d's KV-cache indexer, NVIDIA Dynamo, sglang-router).

The radix cache reports to a ``KVEvents`` sink: ``stored`` when a leaf of new full pages goes
into the tree, ``removed`` when eviction drops pages, ``cleared`` when the whole cache is
reset. `KVEventLog` names each page the way vLLM does and keeps the records until the engine
``take``s them (once a step; engine/kv_events.py publishes them). `NoKVEvents` is the null
object: no hash is computed, nothing is kept.

Block hashes, as vLLM computes them (checked against vLLM v0.11 .. main of 2026,
``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens`` and ``init_none_hash``, with its
default ``prefix_caching_hash_algo="sha256"``, ``vllm/utils/hashing.py``)::

    sha256(x)    = hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    NONE_HASH    = sha256(os.environ["PYTHONHASHSEED"])   (32 random bytes when it is unset)
    hash(page i) = sha256((hash(page i-1) or NONE_HASH, tuple(page i's token ids), None))
    on the wire  = int.from_bytes(hash, "big") & (2**64 - 1)
                   (vLLM's default VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)

``None`` is the extra keys of a plain text request (no multimodal input or cache salt, none
of which radixserve has); a LoRA request's pages use ``(lora_id,)`` (the engine's adapter id,
where vLLM hashes the adapter's name) and carry ``lora_id`` in their ``BlockStored``. A router
that hashes the same tokens with the same
PYTHONHASHSEED and block size gets the same keys; without PYTHONHASHSEED the chain's seed is
random per engine process, as in vLLM, and nobody else can compute the keys.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from typing import Protocol

_LOW_64 = (1 << 64) - 1
LORA_KEY_SHIFT = 1 << 32  # NOTE: kv_manager.LORA_KEY_SHIFT (that module imports this one's)


def vllm_sha256(obj: object) -> bytes:
    """vLLM's default prefix-cache hash: SHA-256 of the object's pickle."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(seed: str | None) -> bytes:
    """The parent hash of a sequence's first page: from ``seed`` (PYTHONHASHSEED's value),
    random when there is none."""
    return os.urandom(32) if seed is None else vllm_sha256(seed)


def external_hash(block_hash: bytes) -> int:
    """A page's hash as events carry it: the low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & _LOW_64


def chain_hashes(prev: bytes, token_ids: list[int], block_size: int) -> list[bytes]:
    """vLLM's hashes of the whole pages of ``token_ids`` (cache keys, kv_manager.cache_tokens),
    chained after the page hashed ``prev`` (the chain's root for a sequence's first page).
    A LoRA request's keys are offset by its adapter id; its pages hash their plain tokens with
    the id as extra key, as vLLM's with the adapter's."""
    lora_id = (token_ids[0] // LORA_KEY_SHIFT or None) if token_ids else None
    if lora_id is not None:
        token_ids = [t % LORA_KEY_SHIFT for t in token_ids]
    extra = None if lora_id is None else (lora_id,)
    hashes = []
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        prev = vllm_sha256((prev, tuple(token_ids[i:i + block_size]), extra))
        hashes.append(prev)
    return hashes


@dataclass(slots=True)
class BlockStored:
    """Full pages entered the cache. ``block_hashes``/``parent_block_hash`` are 64-bit
    `external_hash`es; ``token_ids`` are all the pages' tokens, ``block_size`` each."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None  # the pages' LoRA adapter (the engine's id), None: the base


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEvents(Protocol):
    """The prefix cache's events sink. Called by the cache under the engine's single thread;
    nothing here is locked: ``take`` must be called on that same thread."""

    def stored(self, parent: bytes | None, token_ids: list[int]) -> list[bytes]:
        """Record that the full pages of ``token_ids`` (a whole number of pages) were cached
        after the page hashed ``parent`` (None: they start a sequence); return each page's
        full hash, for the cache to keep beside the page (an empty list when disabled)."""

    def removed(self, hashes: list[bytes]) -> None:
        """Record that the pages with these (`stored`-returned) hashes left the cache."""

    def cleared(self) -> None:
        """Record that the cache dropped everything."""

    def take(self) -> list[KVEvent]:
        """The records since the last ``take``, in order; clears them."""


class NoKVEvents:
    """The null sink: events are off. Nothing is hashed or kept."""

    def stored(self, parent: bytes | None, token_ids: list[int]) -> list[bytes]:
        return []

    def removed(self, hashes: list[bytes]) -> None:
        pass

    def cleared(self) -> None:
        pass

    def take(self) -> list[KVEvent]:
        return []


class KVEventLog:
    """Records events with vLLM's block hashes for pages of ``block_size`` tokens.

    ``seed``: PYTHONHASHSEED's value (the chain's root, see the module docstring);
    `from_env` reads it from the environment, as vLLM does.
    """

    def __init__(self, block_size: int, seed: str | None) -> None:
        self.block_size = block_size
        self.root_hash = none_hash(seed)
        self._events: list[KVEvent] = []

    @classmethod
    def from_env(cls, block_size: int) -> KVEventLog:
        return cls(block_size, os.environ.get("PYTHONHASHSEED"))

    def stored(self, parent: bytes | None, token_ids: list[int]) -> list[bytes]:
        bs = self.block_size
        assert len(token_ids) % bs == 0 and token_ids, f"{len(token_ids)} tokens, pages of {bs}"
        hashes = chain_hashes(parent or self.root_hash, token_ids, bs)
        lora_id = token_ids[0] // LORA_KEY_SHIFT or None
        if lora_id is not None:
            token_ids = [t % LORA_KEY_SHIFT for t in token_ids]
        self._events.append(BlockStored(
            [external_hash(h) for h in hashes],
            None if parent is None else external_hash(parent), list(token_ids), bs, lora_id))
        return hashes

    def removed(self, hashes: list[bytes]) -> None:
        if hashes:
            self._events.append(BlockRemoved([external_hash(h) for h in hashes]))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events
