"""Prompt log-probabilities: which rows of each prefill chunk score which prompt tokens, and
how a request collects them (no torch; the runner computes them: runner/prompt_logprobs.py).

Prompt token i (i >= 1) gets log p(t_i | t_<i), read from the logits at position i - 1; token 0
has none (None, as in vLLM and OpenAI's ``echo``). A chunk that feeds positions [a, b) of a
prompt of L tokens therefore scores tokens a+1 .. min(b, L-1), from its rows 0 .. :

    prompt:        t0  t1  t2 | t3  t4  t5 | t6  t7          (L = 8)
    chunk [0, 3):  r0  r1  r2                  -> t1 t2 t3
    chunk [3, 6):              r0  r1  r2      -> t4 t5 t6
    chunk [6, 8):                          r0  -> t7   (r1 samples the first output token)

NOTE: a request that asks for prompt logprobs takes no prefix-cache hit until it has them all
(cached tokens are not fed, so they would have no logits: `Request.reads_prefix_cache`), and
the values it has collected survive a preemption: a recomputed chunk is asked only for the
tokens past them, so each prompt token is scored exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.core.sched_output import PromptLogprobsWork

TopLogprobs = list[tuple[int, float]]


@dataclass(slots=True)
class PromptLogprobs:
    """One request's prompt logprobs so far: entry i belongs to prompt token i (entry 0 is
    None). ``num_top``: how many alternatives each position reports (0: the token's only)."""

    num_prompt_tokens: int
    num_top: int
    logprobs: list[float | None] = field(default_factory=lambda: [None])
    top_logprobs: list[TopLogprobs | None] = field(default_factory=lambda: [None])

    @property
    def is_complete(self) -> bool:
        return len(self.logprobs) >= self.num_prompt_tokens

    def work(self, prompt_token_ids: list[int], start: int, num_new: int
             ) -> PromptLogprobsWork | None:
        """What a chunk feeding positions [start, start + num_new) computes: the prompt tokens
        past those collected whose logits it produces, or None when there are none."""
        first = max(start + 1, len(self.logprobs))  # the first token to score
        last = min(start + num_new, self.num_prompt_tokens - 1)  # inclusive
        if first > last:
            return None
        return PromptLogprobsWork(self.num_top, first - 1 - start,
                                  prompt_token_ids[first:last + 1])

    def add(self, logprobs: list[float], top_logprobs: list[TopLogprobs]) -> None:
        """Append a chunk's results, in prompt order (what `work` asked for). Mutates self."""
        self.logprobs.extend(logprobs)
        self.top_logprobs.extend(top_logprobs)
        assert len(self.logprobs) <= self.num_prompt_tokens, "a prompt token scored twice"
