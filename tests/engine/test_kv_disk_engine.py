"""The disk tier end to end on the embedded model (kvdisk/, issue 59): pages evicted from a
small pool, or cached at shutdown, come back from the disk with greedy tokens and logprobs
equal to computing them; a damaged file is ignored and its pages computed; the budget holds;
two engines share one folder."""

from __future__ import annotations

import os

import pytest

from radixserve import LLM, SamplingParams
from radixserve.core.kv.kv_events import chain_hashes
from radixserve.kvdisk.tier import ROOT_HASH

BS = 16
BLOCKS = 12  # the pool: 192 tokens
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
A = [(7 * i) % 3000 + 100 for i in range(100)]  # 6 full pages before the last token
B = [(11 * i) % 3000 + 50 for i in range(170)]  # fills the pool: A's pages are evicted
C = [(13 * i) % 3000 + 70 for i in range(170)]
A_CACHED = (len(A) - 1) // BS * BS


def make_llm(folder, **kw) -> LLM:
    return LLM(block_size=BS, num_kv_blocks=BLOCKS, show_progress=False,
               kv_disk_cache=str(folder),
               speculative="off", **kw)


def run(llm: LLM, prompt: list[int]):
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    return out.outputs[0].token_ids, out.outputs[0].logprobs, out.num_cached_tokens


@pytest.fixture(scope="module")
def reference():
    """A's tokens and logprobs computed with no disk tier."""
    llm = LLM(block_size=BS, num_kv_blocks=BLOCKS, show_progress=False, speculative="off")
    assert type(llm.engine.scheduler.kv.disk).__name__ == "NoDiskTier"  # off by default
    tokens, logprobs, _ = run(llm, A)
    llm.close()
    return tokens, logprobs


def page_files(folder) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]


def a_page_path(llm: LLM, page: int) -> str:
    key = chain_hashes(ROOT_HASH, A[:(page + 1) * BS], BS)[page]
    return llm.engine.scheduler.kv.disk.store.path(key)


def test_evicted_pages_come_back_exactly(tmp_path, reference):
    llm = make_llm(tmp_path)
    kv = llm.engine.scheduler.kv
    assert run(llm, A)[:2] == reference
    run(llm, B)  # A's pages leave the pool, onto the disk
    kv.disk.flush()
    assert kv.disk.stats.num_pages_queued >= 5
    tokens, logprobs, cached = run(llm, A)
    assert (tokens, logprobs) == reference
    assert cached == A_CACHED  # the tree's pages and the disk's
    assert kv.disk.stats.num_pages_restored >= 5 and kv.num_disk_hit_tokens >= 5 * BS
    llm.close()


def test_a_restart_restores_and_a_damaged_file_is_recomputed(tmp_path, reference):
    llm = make_llm(tmp_path)
    run(llm, A)
    llm.close()  # nothing was evicted: A's pages are saved at shutdown
    assert len(page_files(tmp_path)) == A_CACHED // BS

    llm = make_llm(tmp_path)
    assert run(llm, A) == (*reference, A_CACHED)
    bad = a_page_path(llm, 3)
    llm.close()

    with open(bad, "r+b") as f:  # the payload's last byte
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0xFF]))
    llm = make_llm(tmp_path)
    assert run(llm, A) == (*reference, 3 * BS)  # pages 0-2 restored, 3 on computed
    store = llm.engine.scheduler.kv.disk.store
    assert store.stats.num_corrupt == 1
    llm.close()
    assert os.path.exists(bad)  # computed again and saved at shutdown, whole this time
    assert store.get(chain_hashes(ROOT_HASH, A[:4 * BS], BS)[3]) is not None


def test_the_budget_holds(tmp_path, reference):
    page = make_llm(tmp_path).engine.scheduler.kv.disk.pages.page_bytes
    budget_gb = 4.5 * page / 1024**3
    llm = make_llm(tmp_path, kv_disk_cache_gb=budget_gb)
    run(llm, A)
    run(llm, B)
    llm.close()
    assert 0 < sum(os.path.getsize(p) for p in page_files(tmp_path)) <= 4.5 * page


def test_two_engines_on_one_folder(tmp_path, reference):
    """Two engines at once on one folder (as data-parallel replicas): what one saves the
    other reads, and both save the same pages without harm."""
    first, second = make_llm(tmp_path), make_llm(tmp_path)
    run(first, A)
    run(first, B)
    run(first, C)  # every page of A on the disk
    first.engine.scheduler.kv.disk.flush()
    assert run(second, A) == (*reference, A_CACHED)
    run(second, C)  # C's pages saved by both
    first.close()
    second.close()
    for llm in first, second:
        assert llm.engine.scheduler.kv.disk.store.stats.num_corrupt == 0

