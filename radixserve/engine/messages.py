"""Typed messages between the frontend (API process or offline LLM) and the engine core.

msgspec Structs, so a schema error surfaces at decode time when they cross a process boundary.
A request goes in once; outputs come back batched, one ``EngineCoreOutputs`` per step. The
output structs are created by the thousand per second and hold only numbers, strings and
lists of them (no reference cycles possible), so the garbage collector does not track them
(``gc=False``).
"""

from __future__ import annotations

import msgspec

from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    priority: int = 0
    pooling_params: PoolingParams | None = None  # set: an embedding (prefill-only) request


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens of one request from one step. ``top_logprobs`` rows are [(id, logprob), ...].

    ``queue_time`` (seconds from arrival to first scheduling) rides on the first output only.
    ``error`` is set, with finish_reason "abort", when the engine refused the request, and
    with finish_reason "error" when a fault while running it ended it (a server error).
    ``pooled`` is an embedding request's pooled hidden state (its one, finishing output).
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None
    error: str | None = None
    pooled: list[float] | None = None


class SchedulerStats(msgspec.Struct, array_like=True, gc=False):
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_kv_blocks: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0  # speculative decoding: verified drafts, their tokens, accepted
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []  # drafts whose i-th token was accepted


class EngineCoreOutputs(msgspec.Struct, array_like=True, gc=False):
    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0
    stats: SchedulerStats | None = None


# -- frontend → engine-core process -------------------------------------------------------

class AddRequest(msgspec.Struct, tag="add", array_like=True):
    request: EngineCoreRequest


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


EngineInput = AddRequest | AbortRequests | Shutdown


class EngineReady(msgspec.Struct):
    """Sent once by the engine-core process when its model is loaded (or failed to load)."""

    max_model_len: int = 0
    vocab_size: int = 0
    num_kv_blocks: int = 0
    block_size: int = 0
    error: str | None = None
