"""Results returned by the offline API (shaped like vLLM's RequestOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(slots=True)
class CompletionOutput:
    """One sample. ``logprobs``: per generated token, {token_id: Logprob} (sampled + top-N)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """A request's samples. ``prompt_logprobs`` (when `SamplingParams.prompt_logprobs` was
    set): per prompt token, {token_id: Logprob} (the token + top-N), None for the first."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
