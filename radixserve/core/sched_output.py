"""Plain data passed from the scheduler to the model runner and back."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's share of a step: feed ``token_ids`` at positions ``start_pos...``.

    ``block_ids`` is the sequence's whole block table (read-only for the runner). When
    ``sample`` is set, the last fed position produces the next token; the sampling fields
    are then filled (references to the request's lists: the runner only reads them).
    ``pooling`` is set on every chunk of an embedding request (which never samples): mean
    pooling returns each chunk's sum of hidden states, last pooling the last prompt token's
    hidden state on the chunk that ends the prompt (``is_last_chunk``).
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    sampling_params: SamplingParams | None = None
    seed: int = 0
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None
    stop_token_ids: frozenset[int] = frozenset()
    pooling: PoolingParams | None = None
    is_last_chunk: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    num_batched_tokens: int
    preempted_ids: list[str]

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(slots=True)
class ModelRunnerOutput:
    """Results for the sequences with ``sample`` set, in the order they appear in the batch.

    ``logprobs[i]`` is the sampled token's logprob and ``top_logprobs[i]`` a list of
    (token_id, logprob) pairs; both are None for rows that did not ask for logprobs.
    ``pooled`` maps each embedding request of the step that pooled something to its vector
    (float32 values: a chunk's hidden-state sum for mean pooling, the last hidden state for
    last pooling; see `ScheduledSeq`).
    """

    request_ids: list[str]
    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    pooled: dict[str, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class GrammarBitmask:
    """The allowed-token bitmask of the step's constrained rows: row i of ``bitmask`` (an int32
    tensor ``[len(request_ids), ceil(vocab / 32)]``, a Future while it is being filled) belongs
    to ``request_ids[i]``; other sampling rows are unconstrained."""

    request_ids: list[str]
    bitmask: Future
