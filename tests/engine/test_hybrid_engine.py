"""The engine's guarantees on a hybrid model (a tiny Qwen3.5: three Gated DeltaNet layers and
one gated-attention layer, blocks of 4): greedy tokens alone = batched = chunked = preempted =
resumed from prefix-cache snapshots, and equal to transformers' own greedy generation; a
multi-turn chat hits the cache on every turn; every state slot comes back."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from test_llm_embedded import token_ids
from tiny_hybrid import make_qwen35_hf_model, qwen35_hf_to_gguf

from radixserve import LLM, SamplingParams
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_snapshots import Snapshots
from radixserve.core.kv.recurrent_states import RecurrentStates
from radixserve.core.kv.state_pool import StatePool
from radixserve.core.scheduler import Scheduler
from radixserve.core.spec_hooks import NO_SPEC
from radixserve.config import SpeculativeConfig
from radixserve.spec.factory import make_spec
from radixserve.kernels import native

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BS = 4


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (5, 30, 13, 9, 22, 17)]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_qwen35_hf_model(tmp_path_factory.mktemp("qwen35") / "hf", seed=7)


@pytest.fixture(scope="module")
def llm(hf_dir, tmp_path_factory):
    """The Q8_0 GGUF, as stored: native linears, whose rows do not depend on the batch."""
    if native.load() is None:
        pytest.skip("exact invariance needs the native kernels")
    path = qwen35_hf_to_gguf(hf_dir, tmp_path_factory.mktemp("q8") / "q.gguf", "Q8_0")
    return LLM(str(path), block_size=BS, show_progress=False)


@pytest.fixture(scope="module")
def alone(llm):
    return [llm.generate(p, GREEDY)[0].outputs[0].token_ids
            for p in _prompts(llm.engine.vocab_size)]


class swapped:
    """Run the shared LLM with another scheduler (config, pool sizes, cache), then restore;
    both address the same KV and state tensors, so the old cache is emptied first."""

    def __init__(self, llm, num_blocks=None, num_slots=None, caching=False, spec=NO_SPEC,
                 **changes):
        self.engine = llm.engine
        self.old = old = self.engine.scheduler
        pool = BlockPool(num_blocks or old.kv.block_pool.num_blocks)
        states = StatePool(num_slots or self.engine.runner.states.num_slots)
        cache = RadixCache(pool, BS, snapshots=Snapshots(states)) if caching else NoPrefixCache(pool)
        kv = KVCacheManager(pool, cache, BS, old.kv.groups,
                            RecurrentStates(states, cache, BS, caching))
        self.new = Scheduler(replace(old.config, **changes), kv, old.max_model_len, spec)

    def __enter__(self):
        self.old.kv.prefix_cache.evict(self.old.kv.block_pool.num_blocks)
        while self.old.kv.prefix_cache.evict_snapshot():
            pass
        self.engine.scheduler = self.new
        return self.new

    def __exit__(self, *exc):
        self.engine.scheduler = self.old


def test_batch_equals_alone(llm, alone):
    assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone


def test_chunked_prefill_equals_alone(llm, alone):
    with swapped(llm, max_num_batched_tokens=5) as s:
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
        s.check_integrity()


def test_few_state_slots_queue_requests_and_all_come_back(llm, alone):
    with swapped(llm, num_slots=2) as s:
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
        assert s.kv.states.pool.num_free == 2


def test_preempted_equals_alone(llm, alone):
    with swapped(llm, num_blocks=14, caching=True, max_num_batched_tokens=8) as s:
        preempted = []
        original = s._preempt

        def spy(request):
            preempted.append(request.request_id)
            original(request)

        s._preempt = spy
        assert token_ids(llm.generate(_prompts(llm.engine.vocab_size), GREEDY)) == alone
        assert preempted, "the small pool should have forced preemption"
        s.check_integrity()


def test_prefix_cache_hits_resume_from_snapshots_and_equal_a_cold_run(llm):
    prefix = _prompts(llm.engine.vocab_size)[1]
    prompts = [prefix + p for p in _prompts(llm.engine.vocab_size)]
    with swapped(llm):
        cold = token_ids(llm.generate(prompts, GREEDY))
    with swapped(llm, caching=True) as s:
        first = llm.generate(prompts, GREEDY)
        second = llm.generate(prompts, GREEDY)
        assert token_ids(first) == token_ids(second) == cold
        # each prompt resumes at its own last prefill snapshot: its last full page
        assert [r.num_cached_tokens for r in second] == [
            (len(r.prompt_token_ids) - 1) // BS * BS for r in second]
        s.check_integrity()


def test_multi_turn_chat_hits_every_turn(llm):
    vocab = llm.engine.vocab_size
    rng = random.Random(3)
    history: list[int] = [rng.randrange(vocab) for _ in range(21)]
    with swapped(llm):
        cold_turns = []
        h = list(history)
        for _ in range(4):
            out = llm.generate(h, GREEDY)[0].outputs[0].token_ids
            cold_turns.append(out)
            h = h + out + [rng.randrange(vocab) for _ in range(7)]
    rng = random.Random(3)
    history = [rng.randrange(vocab) for _ in range(21)]
    with swapped(llm, caching=True) as s:
        for turn in range(4):
            result = llm.generate(history, GREEDY)[0]
            assert result.outputs[0].token_ids == cold_turns[turn]
            if turn:  # resumes after the previous answer's last full page
                assert result.num_cached_tokens == previous_end
            previous_end = (len(history) + len(result.outputs[0].token_ids) - 1) // BS * BS
            history = history + result.outputs[0].token_ids + [rng.randrange(vocab)
                                                              for _ in range(7)]
        s.check_integrity()
        # the engine view marks the nodes a hit can resume at
        assert any(node.snapshot for node in s.kv.prefix_cache.summary(64, 16))


def test_float_model_greedy_equals_transformers_generate(hf_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ours = LLM(str(hf_dir), block_size=BS, show_progress=False)
    prompts = _prompts(ours.engine.vocab_size)[:3]
    for prompt, tokens in zip(prompts, token_ids(ours.generate(prompts, GREEDY))):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=12,
                                     do_sample=False, min_new_tokens=12)
        assert tokens == out[0, len(prompt):].tolist()


def test_speculation_keeps_greedy_output_through_rejected_drafts(llm):
    """n-gram drafts on repetitive text, verified in one step each: the kept tokens' states
    come from the draft slots, the rejected ones never reach the state."""
    assert llm.engine.scheduler.spec.enabled, "speculation (auto) runs on hybrid models"
    # n-gram drafts of 4 whenever the text repeats (not adaptive: the same on a busy machine)
    spec = make_spec(SpeculativeConfig("ngram", 4, adaptive=False), 0, BS)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    vocab = llm.engine.vocab_size
    prompts = [[(5 + i % 4) % vocab for i in range(24)], [(9 + i % 3) % vocab for i in range(25)],
               _prompts(vocab)[1]]
    with swapped(llm, spec=spec) as s:
        got = token_ids(llm.generate(prompts, greedy))
        assert s.kv.states.num_held == 0
    with swapped(llm):  # no speculation
        assert got == token_ids(llm.generate(prompts, greedy))
    drafted, accepted = spec.num_draft_tokens, spec.num_accepted_tokens
    assert drafted > accepted, (drafted, accepted)  # some drafts were rejected
