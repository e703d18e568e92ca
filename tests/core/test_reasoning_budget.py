"""The reasoning budget in the engine core (core/reasoning_budget.py): the scheduler writes the
forced end of thinking in place of the sampled token once exactly ``budget`` reasoning tokens
are out, counting only inside the block; drafts never carry the reasoning past the budget."""

from __future__ import annotations

import pytest

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.reasoning_budget import NO_BUDGET, ThinkingBudget
from radixserve.core.request import Request
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput
from radixserve.core.scheduler import Scheduler
from radixserve.sampling_params import SamplingParams, ThinkingTags

START, END, MSG, EOS = [90, 91], [92], [80, 81], 99
THINK = 7  # the token the fake model samples, always


def tags(starts_in_reasoning=False, message=MSG) -> ThinkingTags:
    return ThinkingTags(start_token_ids=START, end_token_ids=END,
                        forced_token_ids=message + END, starts_in_reasoning=starts_in_reasoning)


def make_scheduler() -> Scheduler:
    pool = BlockPool(64)
    return Scheduler(SchedulerConfig(8, 32), KVCacheManager(pool, NoPrefixCache(pool), 4), 256)


def make_request(budget, thinking_tags, max_tokens=20, logprobs=None) -> Request:
    params = SamplingParams(max_tokens=max_tokens, thinking_token_budget=budget,
                            thinking_tags=thinking_tags, logprobs=logprobs)
    return Request("r", [1, 2, 3], params, frozenset([EOS]), seed=0, max_tokens=max_tokens)


def run(request: Request, script: list[int] = ()) -> list:
    """Step ``request`` to its end; the fake model samples ``script`` in order, then THINK.
    Returns every step's output for it."""
    s = make_scheduler()
    s.add_request(request)
    outputs, script = [], list(script)
    while s.num_unfinished:
        sched = s.schedule()
        sampled = [q.request_id for q in sched.seqs if q.sample]
        tokens = [script.pop(0) if script else THINK for _ in sampled]
        lps = [-0.5 if request.sampling_params.logprobs is not None else None] * len(sampled)
        outputs += s.update_from_output(sched, ModelRunnerOutput(sampled, tokens, lps,
                                                                 [None] * len(sampled)))
        s.check_integrity()
    return outputs


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_prompt_opened_block_counts_from_the_first_token(budget):
    request = make_request(budget, tags(starts_in_reasoning=True))
    run(request)
    assert request.output_token_ids[:budget] == [THINK] * budget
    assert request.output_token_ids[budget:budget + 3] == MSG + END
    assert request.num_output_tokens == 20  # then the answer, within max_tokens
    assert request.finish_reason == "length"


def test_model_opening_the_block_counts_after_the_tag():
    request = make_request(3, tags())
    run(request, START + [5, 6, 7, 8, 9])
    assert request.output_token_ids[:8] == START + [5, 6, 7] + MSG + END[:1]
    assert request.output_token_ids[8] == 9  # the sampled 8 was replaced, 9 answers


def test_no_message_forces_only_the_end_tag():
    request = make_request(2, tags(starts_in_reasoning=True, message=[]), max_tokens=5)
    run(request, [4, 5, 6, 7])
    assert request.output_token_ids == [4, 5] + END + [7, THINK]


def test_reasoning_closed_before_the_budget_is_left_alone():
    request = make_request(4, tags(starts_in_reasoning=True), max_tokens=8)
    run(request, [4, 5] + END + [6, 6, 6, 6, EOS])
    assert request.output_token_ids == [4, 5] + END + [6, 6, 6, 6, EOS]
    assert request.finish_reason == "stop"


def test_output_that_does_not_open_the_block_has_no_budget():
    request = make_request(0, tags(), max_tokens=6)
    run(request, [START[0], 4, 5])  # starts like the tag, then not
    assert request.output_token_ids == [START[0], 4, 5, THINK, THINK, THINK]


def test_an_end_tag_the_model_began_is_completed_without_the_message():
    end = [92, 93, 94]
    three = ThinkingTags(start_token_ids=START, end_token_ids=end, forced_token_ids=MSG + end,
                         starts_in_reasoning=True)
    request = make_request(3, three, max_tokens=8)
    run(request, [4, 92, 93, 5])  # the tag's first two tokens are the 2nd and 3rd
    assert request.output_token_ids[:4] == [4, 92, 93, 94]  # 3 generated, then the rest
    assert request.output_token_ids[4:] == [THINK] * 4 and request.budget.phase == "after"


def test_forced_tokens_stop_at_max_tokens():
    request = make_request(2, tags(starts_in_reasoning=True), max_tokens=3)
    run(request)
    assert request.output_token_ids == [THINK, THINK, MSG[0]]
    assert request.finish_reason == "length"


def test_forced_tokens_reach_the_output_with_certain_logprobs():
    request = make_request(1, tags(starts_in_reasoning=True), max_tokens=6, logprobs=0)
    outputs = run(request)
    tokens = [t for out in outputs for t in out.new_token_ids]
    logprobs = [lp for out in outputs for lp in out.logprobs]
    assert tokens == request.output_token_ids == [THINK] + MSG + END + [THINK, THINK]
    assert logprobs == [-0.5, 0.0, 0.0, 0.0, -0.5, -0.5]


def test_without_budget_or_tags_nothing_is_forced():
    assert make_request(None, tags()).budget is NO_BUDGET
    assert make_request(3, None).budget is NO_BUDGET
    request = make_request(None, tags(starts_in_reasoning=True), max_tokens=4)
    run(request)
    assert request.output_token_ids == [THINK] * 4


def test_drafts_are_capped_before_the_budget():
    budget = ThinkingBudget(5, tags(starts_in_reasoning=True))
    assert budget.cap_draft(8, 1) == 4  # 4 drafts + the bonus token: 5 reasoning tokens
    budget.num_reasoning = 5
    assert budget.cap_draft(8, 1) <= 0 and budget.take_forced([7] * 5) == MSG + END
    assert budget.cap_draft(8, 1) == 8 and budget.take_forced([7] * 5) == []  # once, free
    assert ThinkingBudget(5, tags()).cap_draft(8, 2) == 3  # before the start tag: bounded too


def test_tags_are_validated():
    with pytest.raises(ValueError, match="end_token_ids"):
        ThinkingTags(start_token_ids=START, end_token_ids=END, forced_token_ids=MSG)
    with pytest.raises(ValueError, match="start tag"):
        ThinkingTags(start_token_ids=[], end_token_ids=END, forced_token_ids=END)
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=-1)
    with pytest.raises(ValueError, match="vocabulary"):
        SamplingParams(thinking_token_budget=1, thinking_tags=tags()).validate_vocab(92)  # the end tag is 92
