"""A reasoning budget: how many tokens one request may think before the engine ends its
thinking (``SamplingParams.thinking_token_budget``; the tags are ``thinking_tags``).

The scheduler shows `ThinkingBudget` each token appended to the output (`observe`) and, before
appending a sampled token, asks whether the budget is spent (`take_forced`): then the forced
tokens (the budget message and the end tag) replace the sampled one. That token was not fed
to the model yet, so nothing in the KV cache changes (one forward is spent on it: simpler
than forcing right after the last reasoning token, which could be inside a verified draft).

    output: [ start tag? | reasoning: exactly `budget` tokens | forced: message + end tag | answer ]

Only reasoning counts: a request whose output does not open the block (its first tokens are
not the start tag, and its prompt did not open it) never has a budget to apply; one whose
prompt opened it counts from its first token; one that writes the start tag counts after it.
Plain Python (no torch), like the rest of core/.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixserve.sampling_params import SamplingParams, ThinkingTags

_PREFIX, _REASONING, _AFTER = "prefix", "reasoning", "after"


@dataclass(slots=True)
class ThinkingBudget:
    """One request's count of reasoning tokens against its budget. Mutated by `observe` and
    `take_forced` on the engine thread only. ``phase``: ``prefix`` (the output may still open
    the block with the start tag), ``reasoning`` (counting) or ``after`` (the block ended or
    never opened: nothing more to do)."""

    budget: int
    tags: ThinkingTags
    phase: str = _PREFIX
    num_reasoning: int = 0

    def __post_init__(self) -> None:
        if self.tags.starts_in_reasoning:
            self.phase = _REASONING

    @staticmethod
    def for_params(params: SamplingParams) -> ThinkingBudget | NoBudget:
        """The budget ``params`` ask for, or `NO_BUDGET` (no budget, or no tags to apply it)."""
        if params.thinking_token_budget is None or params.thinking_tags is None:
            return NO_BUDGET
        return ThinkingBudget(params.thinking_token_budget, params.thinking_tags)

    def observe(self, output_token_ids: list[int]) -> None:
        """Account for the token just appended to ``output_token_ids``."""
        if self.phase == _PREFIX:
            start, i = self.tags.start_token_ids, len(output_token_ids) - 1
            if output_token_ids[i] != start[i]:
                self.phase = _AFTER  # the output does not open a reasoning block
            elif i + 1 == len(start):
                self.phase = _REASONING  # counted from the token after the tag
        elif self.phase == _REASONING:
            self.num_reasoning += 1
            end = self.tags.end_token_ids
            if output_token_ids[-len(end):] == end:
                self.phase = _AFTER  # the model closed the block itself

    def take_forced(self, output_token_ids: list[int]) -> list[int]:
        """The tokens that must replace the next sampled token: the forced end of thinking
        when ``budget`` reasoning tokens are out, once; else []. Mutates the phase.

        NOTE: a model that has begun writing a multi-token end tag in its last tokens gets
        the rest of the tag, not the message: its own close, as it was writing it."""
        if self.phase != _REASONING or self.num_reasoning < self.budget:
            return []
        self.phase = _AFTER
        end = self.tags.end_token_ids
        for n in range(min(len(end) - 1, self.num_reasoning), 0, -1):
            if output_token_ids[-n:] == end[:n]:
                return end[n:]
        return list(self.tags.forced_token_ids)

    def cap_draft(self, k: int, num_pending: int) -> int:
        """``k`` speculative tokens, fewer while counting: a verified draft must not carry
        the reasoning past the budget (its forced tokens replace a sampled token, never a
        draft). ``num_pending``: the tokens appended before the draft's (the bonus token,
        and those of the step in flight)."""
        if self.phase == _AFTER:
            return k
        return min(k, self.budget - self.num_reasoning - num_pending)


class NoBudget:
    """Null object: the request thinks as long as it likes."""

    def observe(self, output_token_ids: list[int]) -> None:
        return None

    def take_forced(self, output_token_ids: list[int]) -> list[int]:
        return []

    def cap_draft(self, k: int, num_pending: int) -> int:
        return k


NO_BUDGET = NoBudget()
