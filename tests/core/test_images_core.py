"""A prompt's images in the core (core/images.py): the prefix cache tells images apart by their
keys, a chunk of a bidirectional-image model never ends inside an image, the scheduler hands
each chunk the images it touches, and a second prompt with the same image hits the cache
while one with another image does not."""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.core.images import (
    IMAGE_ID_BASE,
    cache_ids,
    fit_chunk,
    overlapping,
    rope_advance,
    rope_shift,
    with_image_ids,
)
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_events import LORA_KEY_SHIFT
from radixserve.core.kv.kv_manager import KVCacheManager, cache_tokens
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams

IMG = 99  # the model's image token


@dataclass
class Image:
    offset: int
    length: int
    key: bytes
    grid: tuple = ()  # a Qwen VL image's token grid (mRoPE positions)


def prompt_with(images: list[Image], n: int) -> list[int]:
    ids = [(7 * i) % 50 + 1 for i in range(n)]
    for im in images:
        ids[im.offset:im.offset + im.length] = [IMG] * im.length
    return ids


def test_cache_ids_carry_the_key_above_every_vocabulary():
    a, b = bytes(range(32)), bytes(range(1, 33))
    ids = cache_ids(a, 20)
    assert all(IMAGE_ID_BASE <= i < LORA_KEY_SHIFT for i in ids)
    assert len(set(ids)) == 8 and ids[:8] == ids[8:16]
    assert cache_ids(b, 20) != ids
    im = Image(3, 5, a)
    tokens = prompt_with([im], 12)
    out = with_image_ids(tokens, [im])
    assert out[:3] == tokens[:3] and out[8:] == tokens[8:] and out[3:8] == ids[:5]
    assert tokens[3:8] == [IMG] * 5  # the request's own ids stay
    assert with_image_ids(tokens[:5], [im]) == tokens[:3] + ids[:2]
    assert with_image_ids(tokens[:3], [im]) == tokens[:3]


def test_a_chunk_ends_before_an_image_or_after_it():
    ims = [Image(10, 8, b"k" * 32), Image(30, 8, b"j" * 32)]
    assert fit_chunk(ims, 0, 14, 14) == 10  # would end inside the first: stops before it
    assert fit_chunk(ims, 0, 18, 18) == 18  # ends at its end
    assert fit_chunk(ims, 10, 4, 100) == 8  # starts at it: the whole image
    assert fit_chunk(ims, 12, 3, 100) == 6  # a hit ended inside it: the rest of it
    assert fit_chunk(ims, 10, 4, 6) == 0  # no room for the image this step
    assert fit_chunk(ims, 18, 14, 14) == 12
    assert overlapping(ims, 0, 10) == [] and overlapping(ims, 9, 11) == [ims[0]]
    assert overlapping(ims, 17, 31) == ims


def scheduler(whole: bool, budget: int) -> Scheduler:
    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, whole_images=whole), kv, 512)


def request(rid: str, ids: list[int], images: list[Image]) -> Request:
    return Request(rid, ids, SamplingParams(max_tokens=1), frozenset(), 0, images=images)


def test_the_scheduler_keeps_images_whole_and_hands_each_chunk_its_images():
    im = Image(6, 8, b"a" * 32)
    s = scheduler(True, 10)
    s.add_request(request("r", prompt_with([im], 20), [im]))
    chunks = []
    for _ in range(4):
        out = s.schedule()
        if not out.seqs:
            break
        seq = out.seqs[0]
        chunks.append((seq.start_pos, seq.num_tokens, len(seq.images)))
        s.requests["r"].num_computed_tokens += seq.num_tokens
    assert chunks[:3] == [(0, 6, 0), (6, 10, 1), (16, 4, 0)]  # never ends inside it


def test_each_chunk_says_how_far_mrope_images_before_it_shift_its_text():
    # a 2 x 4 token grid takes max(2, 4) = 4 positions for its 8 rows: text after it sits
    # 4 before its index; a 1 x 3 grid's 3 rows take 3 (no shift)
    ims = [Image(2, 8, b"a" * 32, (1, 2, 4)), Image(12, 3, b"b" * 32, (1, 1, 3))]
    s = scheduler(False, 5)
    s.add_request(request("r", prompt_with(ims, 20), ims))
    shifts = []
    while (out := s.schedule()).seqs:
        seq = out.seqs[0]
        shifts.append((seq.start_pos, seq.rope_shift, len(seq.images)))
        s.requests["r"].num_computed_tokens += seq.num_tokens
        if seq.start_pos + seq.num_tokens >= 20:
            break
    assert shifts == [(0, 0, 1), (5, 0, 1), (10, -4, 1), (15, -4, 0)]
    assert rope_shift(ims, 25) == -4 and rope_advance(ims[0]) == 4
    assert rope_shift([Image(2, 8, b"a" * 32)], 25) == 0  # no grid: 1-D positions


def test_causal_models_split_images_anywhere():
    im = Image(6, 8, b"a" * 32)
    s = scheduler(False, 10)
    s.add_request(request("r", prompt_with([im], 20), [im]))
    seq = s.schedule().seqs[0]
    assert (seq.num_tokens, len(seq.images)) == (10, 1)


def test_the_same_image_hits_the_cache_and_another_does_not():
    pool = BlockPool(64)
    kv = KVCacheManager(pool, RadixCache(pool, 4), 4)
    a, b = Image(4, 8, b"a" * 32), Image(4, 8, b"b" * 32)
    ids = prompt_with([a], 20)
    first = request("1", ids, [a])
    assert kv.match_and_lock(first) == 0
    assert kv.allocate_slots(first, 20)
    first.num_computed_tokens = 20
    kv.free(first)
    assert cache_tokens(first)[4:12] == cache_ids(a.key, 8)
    assert kv.match_and_lock(request("2", ids, [a])) == 16
    assert kv.match_and_lock(request("3", ids, [b])) == 4  # the text before the image only
