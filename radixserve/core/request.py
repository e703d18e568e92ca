"""Request: one sequence's life inside the engine core (plain Python, no torch)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from radixserve.core.grammar_hooks import NO_GRAMMAR, Grammar
from radixserve.core.prompt_logprobs import PromptLogprobs
from radixserve.core.reasoning_budget import NO_BUDGET, NoBudget, ThinkingBudget
from radixserve.core.spec_hooks import NO_SPEC_STATE
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """A sequence being generated.

    ``all_token_ids`` is prompt + output; ``num_computed_tokens`` chases ``num_tokens``: the
    tokens whose KV is in the cache. ``block_ids`` is the block table (owned blocks, in order)
    of the first KV group; ``window_block_ids`` those of the model's other (sliding-window)
    groups, empty for a model with one group (core/kv/kv_groups.py).

        all_token_ids: [ prompt ........................ | output ....... ]
                       [ computed (KV cached) ... | new (to schedule)    ]
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    stop_token_ids: frozenset[int]
    seed: int
    arrival_time: float = 0.0
    priority: int = 0
    max_tokens: int = 16
    all_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    window_block_ids: list[list[int]] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    queue_time: float | None = None
    grammar: Grammar = NO_GRAMMAR
    spec: Any = NO_SPEC_STATE  # speculative decoding's estimate (set by the scheduler's hooks)
    # an embedding request: prefill-only, pooled instead of sampled (``max_tokens`` 0);
    # ``pooled_sum`` adds up its chunks' hidden-state sums (mean pooling)
    pooling: PoolingParams | None = None
    pooled_sum: list[float] | None = None
    # asked for prompt logprobs: those collected so far (core/prompt_logprobs.py); with
    # ``max_tokens`` 0 the request is prefill-only and finishes when its prompt is scored
    prompt_logprobs: PromptLogprobs | None = None
    # the LoRA adapter it runs with (the engine's id, engine/lora_registry.py); None: the base.
    # Its KV is cached apart from the base's and other adapters' (core/kv/kv_manager.py)
    lora_id: int | None = None
    # its reasoning budget (core/reasoning_budget.py), from its sampling params
    budget: ThinkingBudget | NoBudget = NO_BUDGET
    # its prompt's images (messages.ImageInput: spans of image tokens and their pixels, in
    # prompt order; core/images.py), empty for a text prompt
    images: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        if self.budget is NO_BUDGET:
            self.budget = ThinkingBudget.for_params(self.sampling_params)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_new_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_computed_tokens

    @property
    def reads_prefix_cache(self) -> bool:
        """Whether the request may skip cached prompt tokens: not while it needs every prompt
        token fed (mean pooling, prompt logprobs not yet complete)."""
        if self.pooling is not None and self.pooling.needs_every_token:
            return False
        return self.prompt_logprobs is None or self.prompt_logprobs.is_complete

    @property
    def is_prefill_only(self) -> bool:
        """It computes its prompt and samples nothing (an embedding, or ``max_tokens`` 0)."""
        return self.pooling is not None or self.max_tokens == 0

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)
