"""A reasoning budget under speculation: drafts stop short of the budget (`cap_draft`), so the
forced end of thinking still begins after exactly ``budget`` tokens, and greedy output equals
the run without speculation."""

from __future__ import annotations

import pytest
from test_spec_embedded import speculating

from radixserve import SamplingParams
from radixserve.sampling_params import ThinkingTags

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"  # counting on: drafts are accepted


def _params(llm, budget: int | None) -> SamplingParams:
    tok = llm.get_tokenizer()
    end = tok.encode("</think>", add_special_tokens=False)
    tags = ThinkingTags(start_token_ids=tok.encode("<think>", add_special_tokens=False),
                        end_token_ids=end, starts_in_reasoning=True,
                        forced_token_ids=tok.encode(" Enough.", add_special_tokens=False) + end)
    return SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                          thinking_token_budget=budget, thinking_tags=tags)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("budget", [9])
def test_budget_is_exact_under_speculation(embedded_llm, method, budget):
    free = embedded_llm.generate(PROMPT, _params(embedded_llm, None))[0].outputs[0].token_ids
    plain = embedded_llm.generate(PROMPT, _params(embedded_llm, budget))[0].outputs[0].token_ids
    forced = _params(embedded_llm, budget).thinking_tags.forced_token_ids
    assert plain[:budget] == free[:budget]
    assert plain[budget:budget + len(forced)] == forced
    truths = [embedded_llm.get_tokenizer().encode(PROMPT) + plain]
    with speculating(embedded_llm, method, truths) as s:
        drafted = embedded_llm.generate(PROMPT, _params(embedded_llm, budget))[0].outputs[0]
    assert drafted.token_ids == plain
    assert s.spec.num_accepted_tokens > 0
