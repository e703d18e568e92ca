"""The disk tier's page files (radixserve/kvdisk/store.py): round trip, damaged and foreign
files ignored and deleted, the size budget, and two processes writing one folder."""

from __future__ import annotations

import multiprocessing
import os

from radixserve.kvdisk.store import HEADER_BYTES, DiskPageStore

FP = bytes(range(32))
OTHER_FP = bytes(range(1, 33))


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


def payload(i: int, size: int = 1000) -> bytes:
    return bytes((i + j) % 251 for j in range(size))


def test_round_trip_and_stats(tmp_path):
    store = DiskPageStore(str(tmp_path), FP, 1 << 20)
    assert store.get(key(1)) is None
    assert store.put(key(1), payload(1))
    assert not store.put(key(1), payload(1))  # already there: touched, not rewritten
    assert bytes(store.get(key(1))) == payload(1)
    assert store.contains(key(1)) and not store.contains(key(2))
    s = store.stats
    assert (s.num_pages_written, s.num_pages_read, s.num_bytes_written, s.num_bytes_read) \
        == (1, 1, 1000, 1000)
    assert os.path.getsize(store.path(key(1))) == HEADER_BYTES + 1000
    # a new store on the folder (a restart) reads it
    assert bytes(DiskPageStore(str(tmp_path), FP, 1 << 20).get(key(1))) == payload(1)


def _damage(path: str, how: str) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "flip":
        data[HEADER_BYTES + 10] ^= 0xFF
    elif how == "truncate":
        data = data[:-1]
    elif how == "extend":
        data += b"x"
    elif how == "header":
        data[0:4] = b"XXXX"
    elif how == "empty":
        data = bytearray()
    with open(path, "wb") as f:
        f.write(data)


def test_damaged_files_are_misses_and_deleted(tmp_path):
    store = DiskPageStore(str(tmp_path), FP, 1 << 20)
    for i, how in enumerate(["flip", "truncate", "extend", "header", "empty"]):
        store.put(key(i), payload(i))
        _damage(store.path(key(i)), how)
        assert store.get(key(i)) is None, how
        assert not os.path.exists(store.path(key(i))), how
    assert store.stats.num_corrupt == 5
    assert store.put(key(0), payload(0)) and bytes(store.get(key(0))) == payload(0)


def test_foreign_files_are_misses(tmp_path):
    """A file of another model (its fingerprint), or of another page renamed into place."""
    other = DiskPageStore(str(tmp_path), OTHER_FP, 1 << 20)
    store = DiskPageStore(str(tmp_path), FP, 1 << 20)
    other.put(key(1), payload(1))
    os.makedirs(os.path.dirname(store.path(key(1))), exist_ok=True)
    os.replace(other.path(key(1)), store.path(key(1)))
    assert store.get(key(1)) is None
    store.put(key(2), payload(2))
    os.makedirs(os.path.dirname(store.path(key(3))), exist_ok=True)
    os.replace(store.path(key(2)), store.path(key(3)))
    assert store.get(key(3)) is None
    assert store.stats.num_corrupt == 2


def test_budget_drops_least_recently_used(tmp_path):
    size = HEADER_BYTES + 1000
    store = DiskPageStore(str(tmp_path), FP, 10 * size)
    for i in range(10):
        store.put(key(i), payload(i))
        os.utime(store.path(key(i)), (1000 + i, 1000 + i))
    assert store.get(key(0)) is not None  # read: now the most recent
    store.put(key(10), payload(10))  # over the budget: trimmed to 90% of it
    kept = [i for i in range(11) if store.contains(key(i))]
    assert kept == [0, *range(3, 11)]
    assert sum(os.path.getsize(store.path(key(i))) for i in kept) <= 10 * size
    assert store.stats.num_trimmed == 2


def test_budget_counts_every_model_and_stale_temporaries(tmp_path):
    size = HEADER_BYTES + 1000
    other = DiskPageStore(str(tmp_path), OTHER_FP, 4 * size)
    for i in range(4):
        other.put(key(i), payload(i))
        os.utime(other.path(key(i)), (1000 + i, 1000 + i))
    stale = other.path(key(9)) + ".123.abcd.tmp"
    with open(stale, "wb") as f:
        f.write(b"half")
    os.utime(stale, (1000, 1000))
    store = DiskPageStore(str(tmp_path), FP, 4 * size)
    assert store.put(key(5), payload(5))
    assert not os.path.exists(stale)
    assert [i for i in range(4) if other.contains(key(i))] == [2, 3]


def _writer(root: str, start: int, budget: int) -> None:
    store = DiskPageStore(root, FP, budget)
    for i in range(start, start + 60):
        store.put(key(i % 80), payload(i % 80, 2000))
        got = store.get(key((i * 7) % 80))
        assert got is None or bytes(got) == payload((i * 7) % 80, 2000)


def test_two_processes_on_one_folder(tmp_path):
    """Two writers with overlapping pages, reading each other's, under a budget that makes
    both trim: nothing read is ever wrong, no file is damaged, the budget holds after a
    last trim."""
    budget = 40 * (HEADER_BYTES + 2000)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), s, budget)) for s in (0, 30)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = DiskPageStore(str(tmp_path), FP, budget)
    store.trim()
    for i in range(80):
        got = store.get(key(i))
        assert got is None or bytes(got) == payload(i, 2000)
    assert store.stats.num_corrupt == 0
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path)
                for f in fs)
    assert total <= budget


def test_a_refused_write_is_a_miss_not_an_error(tmp_path):
    store = DiskPageStore(str(tmp_path), FP, 1 << 20)
    with open(os.path.dirname(store.path(key(1))), "wb"):
        pass  # a file where the page's folder goes: every write there fails
    assert not store.put(key(1), payload(1)) and not store.put(key(1), payload(1))
    assert store.stats.num_write_errors == 2 and store.stats.num_pages_written == 0
    assert store.get(key(1)) is None
    assert store.put(key(2 << 248), payload(2))  # another folder


def test_a_model_through_a_symlink_is_the_same_model(tmp_path):
    """A --models-dir folder of links, or the Hugging Face cache's snapshots: the fingerprint
    follows the link, so pages saved by ``serve --model FILE`` are found through it; an edited
    file is another model."""
    from dataclasses import replace

    from radixserve.kvdisk.fingerprint import ModelIdentity

    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    (tmp_path / "dir").mkdir()
    link = tmp_path / "dir" / "alias.gguf"
    link.symlink_to(model)
    ident = ModelIdentity(str(model), "gguf", "float32", "float16", 16, 2, 2, 64, 1, "cpu",
                          "amx")
    before = ident.fingerprint()
    assert replace(ident, model_path=str(link)).fingerprint() == before
    model.write_bytes(b"other weights")
    assert replace(ident, model_path=str(link)).fingerprint() != before
