"""The disk tier on a hybrid model (a tiny Qwen3.5 GGUF, Q8_0 as stored: three Gated DeltaNet
layers and one attention layer): a prompt whose recurrent-state snapshot was pushed out of the
state pool, whose pages were evicted, or that a restarted engine never saw, resumes from the
state and pages read back, with greedy tokens and logprobs equal to computing it; a damaged
state file is ignored and the prompt computed."""

from __future__ import annotations

import os

import pytest
from tiny_hybrid import make_qwen35_hf_model, qwen35_hf_to_gguf

from radixserve import LLM, SamplingParams
from radixserve.core.kv.kv_events import chain_hashes
from radixserve.kernels import native
from radixserve.kvdisk.tier import ROOT_HASH, state_key

BS = 4
BLOCKS = 24  # the pool: 96 tokens
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
A = [(7 * i) % 200 + 10 for i in range(42)]
OTHERS = [[(k * 13 + 11 * i) % 200 + 5 for i in range(60)] for k in range(1, 4)]
A_CACHED = (len(A) - 1) // BS * BS  # the prompt's snapshot: a page before its last token


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    if native.load() is None:
        pytest.skip("exact equality needs the native kernels")
    hf = make_qwen35_hf_model(tmp_path_factory.mktemp("qwen35") / "hf", seed=5)
    return qwen35_hf_to_gguf(hf, tmp_path_factory.mktemp("q8") / "q.gguf", "Q8_0")


def make_llm(gguf, folder=None) -> LLM:
    """Two requests at once: 6 state slots, so three other prompts push A's snapshot out."""
    return LLM(str(gguf), block_size=BS, num_kv_blocks=BLOCKS, max_num_seqs=2,
               show_progress=False, speculative="off",
               kv_disk_cache=str(folder) if folder is not None else None)


def run(llm: LLM, prompt: list[int]):
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    llm.engine.scheduler.kv.check_integrity()
    return out.outputs[0].token_ids, out.outputs[0].logprobs, out.num_cached_tokens


@pytest.fixture(scope="module")
def reference(gguf):
    llm = make_llm(gguf)
    assert type(llm.engine.scheduler.kv.disk).__name__ == "NoDiskTier"
    tokens, logprobs, _ = run(llm, A)
    llm.close()
    return tokens, logprobs


def a_state_path(llm: LLM) -> str:
    key = chain_hashes(ROOT_HASH, A[:A_CACHED], BS)[-1]
    return llm.engine.scheduler.kv.disk.store.path(state_key(key))


def test_a_state_and_pages_pushed_out_come_back_exactly(tmp_path, gguf, reference):
    llm = make_llm(gguf, tmp_path)
    kv = llm.engine.scheduler.kv
    assert run(llm, A)[:2] == reference
    for other in OTHERS:
        run(llm, other)
    kv.disk.flush()
    assert kv.disk.stats.num_states_queued >= 1 and os.path.exists(a_state_path(llm))
    assert kv.prefix_cache.cached_len(A) < A_CACHED  # not in memory any more
    assert run(llm, A) == (*reference, A_CACHED)
    assert kv.disk.stats.num_states_restored == 1 and kv.num_disk_hit_tokens > 0
    llm.close()


def test_a_restart_resumes_from_the_saved_state_and_a_damaged_one_is_ignored(
        tmp_path, gguf, reference):
    llm = make_llm(gguf, tmp_path)
    run(llm, A)
    llm.close()  # the pages and the snapshot are saved at shutdown
    llm = make_llm(gguf, tmp_path)
    assert run(llm, A) == (*reference, A_CACHED)
    bad = a_state_path(llm)
    llm.close()

    with open(bad, "r+b") as f:  # cut: a torn write
        f.truncate(os.path.getsize(bad) - 7)
    llm = make_llm(gguf, tmp_path)
    tokens, logprobs, cached = run(llm, A)
    assert (tokens, logprobs) == reference and cached < A_CACHED
    assert llm.engine.scheduler.kv.disk.store.stats.num_corrupt == 1
    llm.close()
