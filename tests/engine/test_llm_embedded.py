"""The offline API on the embedded model: equivalence under batching, chunking, preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixserve import SamplingParams
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.scheduler import Scheduler

PROMPTS = ["The capital of France is", "Write a poem about the sea:\n", "def fibonacci(n):",
           "List three colors:", "Once upon a time, in a faraway land,", "1, 2, 3, 4,"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(embedded_llm):
    return [embedded_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


class swapped_scheduler:
    """Run the shared LLM with another scheduler config / KV pool size, then restore."""

    def __init__(self, llm, num_blocks=None, block_size=None, **sched_changes):
        self.engine = llm.engine
        self.old = self.engine.scheduler
        kv = self.old.kv
        block_size = block_size or kv.block_size
        pool = BlockPool(num_blocks or kv.block_pool.num_blocks,
                         with_null_block=kv.groups.has_sliding)
        self.engine.runner.block_size = block_size
        self.new = Scheduler(replace(self.old.config, **sched_changes),
                             KVCacheManager(pool, NoPrefixCache(pool), block_size, kv.groups),
                             self.old.max_model_len)

    def __enter__(self):
        # NOTE: both schedulers address the same physical KV pool: drop whatever the shared
        # LLM has cached, or its radix tree would point at blocks the swap-in overwrites.
        self.old.kv.prefix_cache.evict(self.old.kv.block_pool.num_blocks)
        self.engine.scheduler = self.new
        return self.new

    def __exit__(self, *exc):
        self.engine.scheduler = self.old
        self.engine.runner.block_size = self.old.kv.block_size


def token_ids(results):
    return [r.outputs[0].token_ids for r in results]


def test_batch_equals_alone(embedded_llm, alone):
    assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == alone


def test_chunked_prefill_equals_alone(embedded_llm, alone):
    with swapped_scheduler(embedded_llm, max_num_batched_tokens=5) as s:
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == alone
        s.check_integrity()


def test_preempted_equals_alone(embedded_llm, alone):
    # 20 blocks of 4 tokens cannot hold six 32-token sequences: some are preempted.
    with swapped_scheduler(embedded_llm, num_blocks=20, block_size=4) as s:
        preemptions = []
        original = s._preempt

        def spy(request):
            preemptions.append(request.request_id)
            original(request)

        s._preempt = spy
        assert token_ids(embedded_llm.generate(PROMPTS, GREEDY)) == alone
        assert preemptions, "the tiny pool should have forced preemption"
        assert s.kv.block_pool.num_free_blocks == 20


def test_n_samples_share_prompt_and_greedy_siblings_agree(embedded_llm, alone):
    out = embedded_llm.generate(PROMPTS[0], GREEDY.clone(n=2))[0]
    assert [o.index for o in out.outputs] == [0, 1]
    assert out.outputs[0].token_ids == out.outputs[1].token_ids == alone[0]


def test_seeded_sampling_is_reproducible_and_batch_independent(embedded_llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=16)
    one = embedded_llm.generate(PROMPTS[1], params)[0].outputs[0].token_ids
    batch = embedded_llm.generate(PROMPTS, [params if i == 1 else SamplingParams(temperature=1.0)
                                            for i in range(len(PROMPTS))])
    assert batch[1].outputs[0].token_ids == one
    other = embedded_llm.generate(PROMPTS[1], params.clone(seed=43))[0].outputs[0].token_ids
    assert other != one


def test_output_fields_and_stop(embedded_llm):
    out = embedded_llm.generate("The capital of France is", SamplingParams(
        temperature=0.0, max_tokens=8, logprobs=3))[0]
    assert out.prompt_token_ids == embedded_llm.get_tokenizer().encode("The capital of France is")
    o = out.outputs[0]
    assert o.finish_reason == "length" and len(o.token_ids) == 8
    assert o.text == embedded_llm.get_tokenizer().decode(o.token_ids)
    assert len(o.logprobs) == 8
    for token, entry in zip(o.token_ids, o.logprobs):
        assert token in entry and 3 <= len(entry) <= 4
        ranked = sorted((lp for lp in entry.values() if lp.rank), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        assert entry[token].logprob == max(lp.logprob for lp in entry.values())  # greedy


def test_stop_string_trims_text(embedded_llm):
    full = embedded_llm.generate("1, 2, 3, 4,", GREEDY)[0].outputs[0].text
    stop = full.strip().split(",")[1].strip()  # a number the model will write
    assert stop
    out = embedded_llm.generate("1, 2, 3, 4,", GREEDY.clone(stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text and full.startswith(out.text)
    kept = embedded_llm.generate("1, 2, 3, 4,", GREEDY.clone(
        stop=[stop], include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text.endswith(stop)


def test_eos_stops_with_stop_reason(embedded_llm):
    conv = [{"role": "user", "content": "Say hi."}]
    out = embedded_llm.chat(conv, SamplingParams(temperature=0.0, max_tokens=200))[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] in embedded_llm.get_tokenizer().eos_token_ids
    assert "<|im_end|>" not in out.text


def test_chat_applies_template(embedded_llm):
    # (not the capital of France: with 8-bit activations, as llama.cpp's, the 135M model
    # answers that one with "L'Étoile, la Marseillaise...", exactly as llama-server does)
    conv = [{"role": "user", "content": "Name three primary colors."}]
    out = embedded_llm.chat(conv, SamplingParams(temperature=0.0, max_tokens=16))[0]
    tok = embedded_llm.get_tokenizer()
    rendered = tok.apply_chat_template(conv, add_generation_prompt=True)
    assert out.prompt_token_ids == tok.encode(rendered, add_special_tokens=False)
    assert "Red" in out.outputs[0].text


def test_stream_concatenates_to_generate(embedded_llm):
    params = GREEDY.clone(max_tokens=20)
    text = "".join(embedded_llm.stream("Once upon a time", params))
    assert text == embedded_llm.generate("Once upon a time", params)[0].outputs[0].text


@pytest.mark.parametrize("prompt, params, match", [
    ("", GREEDY, "empty"),
    ([], GREEDY, "empty|no prompts"),
    ([1] * 9000, GREEDY, "context window"),
    ([10**6], GREEDY, "token ids"),
    ("hi", GREEDY.clone(logit_bias={10**6: 1.0}), "vocabulary"),
    (3.5, GREEDY, "prompt must be"),
])
def test_bad_input_raises_and_llm_keeps_working(embedded_llm, alone, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        embedded_llm.generate(prompt, params)
    assert not embedded_llm.engine.has_unfinished_requests()
    assert embedded_llm.generate(PROMPTS[0], GREEDY)[0].outputs[0].token_ids == alone[0]


def test_prefix_cache_hit_equals_cold_run(embedded_llm):
    prefix = "You are a helpful assistant who answers briefly and precisely. " * 4
    prompts = [prefix + p for p in PROMPTS]
    with swapped_scheduler(embedded_llm):  # NoPrefixCache: a cold reference
        cold = token_ids(embedded_llm.generate(prompts, GREEDY))
    first = embedded_llm.generate(prompts, GREEDY)
    second = embedded_llm.generate(prompts, GREEDY)
    assert token_ids(first) == token_ids(second) == cold
    # whole pages of the prompt, less its last token (always recomputed to sample)
    assert [r.num_cached_tokens for r in second] == [
        (len(r.prompt_token_ids) - 1) // 16 * 16 for r in second]
    embedded_llm.engine.scheduler.check_integrity()


def test_multi_turn_hits_its_own_answer(embedded_llm):
    conv = [{"role": "user", "content": "Name three fruits and describe each in a sentence."}]
    first = embedded_llm.chat(conv, GREEDY.clone(max_tokens=40))[0]
    conv += [{"role": "assistant", "content": first.outputs[0].text},
             {"role": "user", "content": "Which one is the sweetest?"}]
    second = embedded_llm.chat(conv, GREEDY.clone(max_tokens=8))[0]
    # the first turn's prompt and answer, in whole pages, come from the cache
    computed = len(first.prompt_token_ids) + len(first.outputs[0].token_ids) - 1
    assert second.num_cached_tokens == computed // 16 * 16 > len(first.prompt_token_ids)
