"""The engine's guarantees on a tiny MoE model whose experts are the GGUF file's blocks: greedy
output alone = batched = chunked = preempted = from the prefix cache (a token's experts, and
its output, do not depend on which other tokens share its step)."""

from __future__ import annotations

import pytest
from test_llm_embedded import swapped_scheduler, token_ids

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.layers.moe import SparseMoeBlock

pytestmark = pytest.mark.skipif(native.load() is None, reason="needs the native kernels")
PROMPTS = ["the quick brown fox", "radix tree of the cache", "When the engine runs a batch,",
           "1, 2, 3, 4,", "a model token layer weight", "The server said"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module", params=[("qwen3_moe", "Q8_0"), ("mixtral", "Q4_0"),
                                        ("qwen2_moe", "Q8_0")],
                ids=lambda p: "-".join(p))
def moe_llm(request, tiny_moe_files):
    llm = LLM(str(tiny_moe_files(*request.param)), show_progress=False)
    assert isinstance(llm.engine.runner.model.layers[0].mlp, SparseMoeBlock)
    return llm


@pytest.fixture(scope="module")
def alone(moe_llm):
    return [moe_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


def test_batch_equals_alone(moe_llm, alone):
    assert token_ids(moe_llm.generate(PROMPTS, GREEDY)) == alone
    assert len({tuple(t) for t in alone}) > 1  # the prompts do lead somewhere different


def test_chunked_prefill_equals_alone(moe_llm, alone):
    with swapped_scheduler(moe_llm, max_num_batched_tokens=5) as s:
        assert token_ids(moe_llm.generate(PROMPTS, GREEDY)) == alone
        s.check_integrity()


def test_preempted_equals_alone(moe_llm, alone):
    with swapped_scheduler(moe_llm, num_blocks=14, block_size=4) as s:
        preemptions = []
        original = s._preempt

        def spy(request):
            preemptions.append(request.request_id)
            original(request)

        s._preempt = spy
        assert token_ids(moe_llm.generate(PROMPTS, GREEDY)) == alone
        assert preemptions, "the tiny pool should have forced preemption"
        assert s.kv.block_pool.num_free_blocks == 14


def test_prefix_cache_hit_equals_cold_run(moe_llm):
    prompts = ["the cache of the server keeps the prefix of every request " * 3 + p
               for p in PROMPTS]
    with swapped_scheduler(moe_llm):
        cold = token_ids(moe_llm.generate(prompts, GREEDY))
    first = moe_llm.generate(prompts, GREEDY)
    second = moe_llm.generate(prompts, GREEDY)
    assert token_ids(first) == token_ids(second) == cold
    assert all(r.num_cached_tokens > 0 for r in second)
    moe_llm.engine.scheduler.check_integrity()
