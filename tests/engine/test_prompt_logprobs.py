"""Prompt logprobs on the embedded model: computed in the prefill, each prompt token once, the
same alone, batched, chunked, preempted and after a prefix-cache hit, and equal to a
log-softmax over the full logits."""

from __future__ import annotations

import pytest
import torch

from radixserve import SamplingParams
from radixserve.core.prompt_logprobs import PromptLogprobs
from radixserve.core.sched_output import ScheduledSeq

from engine.test_llm_embedded import swapped_scheduler

TEXT = ("The capital of France is Paris. The capital of Germany is Berlin. "
        "Rivers run to the sea, and the sea is salt. ") * 3
SCORE = SamplingParams(max_tokens=0, prompt_logprobs=3)


def values(result, ids):
    """The prompt tokens' own logprobs (None first)."""
    return [None] + [entry[t].logprob for entry, t in zip(result.prompt_logprobs[1:], ids[1:])]


@pytest.fixture(scope="module")
def prompt_ids(embedded_llm):
    return embedded_llm.get_tokenizer().encode(TEXT)


@pytest.fixture(scope="module")
def alone(embedded_llm, prompt_ids):
    return embedded_llm.generate([prompt_ids], SCORE)[0]


def test_scores_every_prompt_token_and_generates_nothing(alone, prompt_ids):
    assert alone.prompt_logprobs[0] is None
    assert len(alone.prompt_logprobs) == len(prompt_ids)
    out = alone.outputs[0]
    assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"
    for token, entry in zip(prompt_ids[1:], alone.prompt_logprobs[1:]):
        assert token in entry and 3 <= len(entry) <= 4
        ranked = sorted((lp for lp in entry.values() if lp.rank), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        assert all(a.logprob >= b.logprob for a, b in zip(ranked, ranked[1:]))
        assert entry[token].logprob <= ranked[0].logprob
        assert entry[token].decoded_token is not None


def test_equals_log_softmax_of_the_full_logits(embedded_llm, alone, prompt_ids):
    runner = embedded_llm.engine.runner
    blocks = list(range(1, 1 + -(-len(prompt_ids) // runner.block_size)))
    (logits,) = runner.all_logits([ScheduledSeq("ref", prompt_ids, 0, blocks, False)])
    ref = torch.log_softmax(logits.float(), -1)
    want = ref[torch.arange(len(prompt_ids) - 1), torch.tensor(prompt_ids[1:])].tolist()
    got = values(alone, prompt_ids)[1:]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    top = ref[:-1].topk(3, dim=-1).indices.tolist()
    assert [list(e)[-3:] if len(e) == 4 else list(e) for e in alone.prompt_logprobs[1:]] == top


def test_batched_with_generation_equals_alone(embedded_llm, alone, prompt_ids):
    outs = embedded_llm.generate(
        [prompt_ids, "hello there", prompt_ids[:40]],
        [SamplingParams(max_tokens=3, prompt_logprobs=3, temperature=0),
         SamplingParams(max_tokens=5), SamplingParams(max_tokens=1, prompt_logprobs=0)])
    assert values(outs[0], prompt_ids) == values(alone, prompt_ids)
    assert len(outs[0].outputs[0].token_ids) == 3
    assert values(outs[2], prompt_ids[:40]) == values(alone, prompt_ids)[:40]
    assert all(len(e) == 1 for e in outs[2].prompt_logprobs[1:])  # the token alone
    assert outs[1].prompt_logprobs is None


def test_chunked_prefill_equals_alone(embedded_llm, alone, prompt_ids):
    with swapped_scheduler(embedded_llm, max_num_batched_tokens=7) as s:
        out = embedded_llm.generate([prompt_ids], SCORE)[0]
        s.check_integrity()
    assert values(out, prompt_ids) == values(alone, prompt_ids)


def test_prefix_cache_hit_is_not_taken_before_scoring(embedded_llm, alone, prompt_ids):
    embedded_llm.generate([prompt_ids], SamplingParams(max_tokens=1))  # now cached
    out = embedded_llm.generate([prompt_ids], SCORE.clone(max_tokens=2))[0]
    assert values(out, prompt_ids) == values(alone, prompt_ids)
    assert out.num_cached_tokens == 0


def test_preempted_equals_alone(embedded_llm, alone, prompt_ids):
    # 24 blocks of 4 tokens: the scoring request and three generations cannot all fit
    with swapped_scheduler(embedded_llm, num_blocks=24, block_size=4,
                           max_num_batched_tokens=16) as s:
        preempted = []
        original = s._preempt
        s._preempt = lambda r: (preempted.append(r.request_id), original(r))
        greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
        outs = embedded_llm.generate(
            [prompt_ids[:60], "One, two,", "A B C", prompt_ids[:60]],
            [SCORE.clone(max_tokens=4), greedy, greedy, SCORE.clone(max_tokens=30)])
        assert preempted
        assert s.kv.block_pool.num_free_blocks == 24
    for out in (outs[0], outs[3]):
        assert values(out, prompt_ids[:60]) == values(alone, prompt_ids)[:60]


def test_n_samples_each_score_the_prompt(embedded_llm, alone, prompt_ids):
    out = embedded_llm.generate([prompt_ids], SCORE.clone(n=2, max_tokens=2))[0]
    assert values(out, prompt_ids) == values(alone, prompt_ids)


def test_work_asks_each_token_once():
    ids = list(range(100, 108))
    scored = PromptLogprobs(len(ids), 2)
    chunks = [scored.work(ids, 0, 3), scored.work(ids, 3, 3), scored.work(ids, 6, 2)]
    assert [(w.first_row, w.targets) for w in chunks] == [
        (0, [101, 102, 103]), (0, [104, 105, 106]), (0, [107])]
    scored.add([-1.0, -2.0], [[(1, -0.5)], [(1, -0.5)]])  # tokens 1 and 2 collected
    again = scored.work(ids, 0, 5)  # recomputed after a preemption
    assert (again.first_row, again.targets) == (2, [103, 104, 105])
    assert scored.work(ids, 0, 2) is None and not scored.is_complete


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True])
def test_bad_prompt_logprobs_refused(bad):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)
