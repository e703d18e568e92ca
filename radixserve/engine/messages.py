"""Typed messages between the frontend (API process or offline LLM) and the engine core.

msgspec Structs, so a schema error surfaces at decode time when they cross a process boundary.
A request goes in once; outputs come back batched, one ``EngineCoreOutputs`` per step.
"""

from __future__ import annotations

import msgspec

from radixserve.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    priority: int = 0


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one request from one step. ``top_logprobs`` rows are [(id, logprob), ...]."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    num_cached_tokens: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True):
    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0
